"""What ``prep`` checks of ``--out`` before it writes, shared by :mod:`prep.run` and :mod:`prep.textcls`:
not an input (:func:`check_not_input`), nothing but a prepared dataset replaced (:func:`check_out`), and one
line
for an ``OSError`` met while writing it (:func:`_os_error`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from prep.dataset import (
    MARKER_FILE,
    foreign_entries,
    is_prepared_dataset,
)
from prep.settings import PrepSection
from vsecore.errors import UserError, disk_error_message, disk_error_reason


def _given_inputs(settings: PrepSection) -> list[tuple[Path, str]]:
    """``(resolved path, option)`` of every input path the settings name."""
    out = []
    for key in PrepSection.path_fields:
        value = getattr(settings, key)
        if key == "out" or value is None:
            continue
        for v in value if isinstance(value, list) else [value]:
            out.append((Path(v).expanduser().resolve(), "--" + key.replace("_", "-")))
    return out


def check_not_input(out: Path, inputs: list[tuple[Path, str]], inside_ok: bool = False) -> None:
    """A :class:`UserError` if ``out`` is, contains or (unless ``inside_ok``) lies inside an input.

    ``--out`` is replaced as a whole, so an input inside it would be deleted, and one equal to it
    overwritten.
    """
    for path, option in inputs:
        if out == path or path.is_relative_to(out):
            raise UserError(f"{out}: --out must not be or contain an input of prep ({path}, given by "
                            f"{option})")
        if not inside_ok and out.is_relative_to(path):
            raise UserError(f"{out}: --out must not lie inside an input of prep ({path}, given by "
                            f"{option})")


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` whose replacement would lose anything but a prepared dataset.

    A missing or empty folder is used; a prepared dataset (:func:`prep.dataset.is_prepared_dataset`)
    is replaced only with ``overwrite``, and not when it also holds files prep does not write;
    anything else (a file, a folder of other things, a read-only folder) is an error and stays
    untouched.
    """
    if not (out.exists() or out.is_symlink()):
        return
    if not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder; give --out a new or empty folder")
    if is_prepared_dataset(out):
        foreign = foreign_entries(out)
        if foreign:
            raise UserError(f"{out}: a prepared dataset, but it also holds '{foreign[0]}', which prep did "
                            f"not write; refusing to replace it (move that away, or give another --out)")
        if not overwrite:
            raise UserError(f"{out}: already holds a prepared dataset; add --overwrite to replace it, "
                            f"or give another --out")
    elif any(out.iterdir()):
        raise UserError(f"{out}: exists, is not empty and is not a prepared dataset (no {MARKER_FILE}); "
                        f"refusing to replace it: give a new or empty folder as --out")
    if not os.access(out, os.W_OK):
        raise UserError(f"{out}: --out is read-only")


def _writes_out(name: Path, out: Path) -> bool:
    """Whether ``name`` is ``out``, a folder above it, or in a sibling prep writes (lock, temporary)."""
    if out.is_relative_to(name):
        return True
    if name == out.parent or not name.is_relative_to(out.parent):
        return False
    first = name.relative_to(out.parent).parts[0]
    return first == out.name or first.startswith(f".{out.name}.")


def _os_error(exc: OSError, out: Path) -> UserError | None:
    """One line for an ``OSError`` met while preparing ``out``: any failure to write ``--out`` (a
    read-only folder or file system, a full disk: in the words of :func:`vsecore.errors.disk_error_message`)
    or a permission denied on an input; ``None`` for anything else (a bug: it keeps its traceback)."""
    why = exc.strerror or str(exc)
    if not exc.filename:
        reason = disk_error_reason(exc)
        return UserError(f"{out}: cannot write --out ({reason})") if reason else None
    name = Path(exc.filename)
    if _writes_out(name, out):
        return UserError(f"{out}: cannot write --out ({disk_error_message(exc) or f'{name}: {why}'})")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):  # an input prep may not read
        return UserError(f"{name}: {why}")
    return None
