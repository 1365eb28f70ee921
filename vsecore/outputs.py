"""The output-path rules every writer follows (``docs/safety.md``).

A command may write a file or a folder only where it cannot destroy what it did not make:

* never over one of the command's own inputs (the same file, or a file inside an input folder);
* never inside an artifact of the toolkit (a prepared dataset, a feature store, a run directory)
  unless the command is that artifact's own writer (``owner``);
* never at ``/`` or at an existing folder where a file is expected;
* an existing file only with ``overwrite`` (``--overwrite``): otherwise the error names it.

The artifacts are recognised by their markers: a prepared dataset by ``.vse-prepared`` (or its
``prep.json``), a feature store by its ``zarr.json``, a run directory by ``.vse-run`` (or its
``config.json`` beside a ``checkpoints/`` folder holding only checkpoints: :func:`is_run_folder`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from vsecore.errors import UserError
from vsecore.jsonfile import read_json

#: the marker files of the artifacts (the prepared dataset's is also :data:`prep.dataset.MARKER_FILE`)
PREPARED_MARKER = ".vse-prepared"
RUN_MARKER = ".vse-run"

#: what :func:`artifact_kind` calls each artifact in messages
PREPARED, STORE, RUN = "prepared dataset", "feature store", "run directory"
#: the names a run directory is recognised by (:func:`is_run_folder`); :mod:`train.run.layout` owns the whole
#: layout and takes these from here
RUN_CONFIG, RUN_CHECKPOINTS, RUN_BEST, RUN_LAST = "config.json", "checkpoints", "best.pt", "last.pt"
#: the files train writes into ``checkpoints/``
RUN_CHECKPOINT_FILES = frozenset({RUN_BEST, RUN_LAST})

#: names of the files a writer made: a set of names, or a pattern a name must match in full
Written = frozenset[str] | re.Pattern[str]


def is_temporary_of(name: str, written: Written) -> bool:
    """Whether ``name`` is the temporary of an atomic write of one of the ``written`` names
    (:func:`vsecore.io.atomic_file`'s ``.NAME.HOST-PID.XXXX.tmp``, or ``.NAME.tmp``)."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return False
    body = name[1:]
    prefixes = [body[:i] for i, ch in enumerate(body) if ch == "."]
    if isinstance(written, re.Pattern):
        return any(written.fullmatch(p) is not None for p in prefixes)
    return any(p in written for p in prefixes)


def is_written_file(entry: os.DirEntry, written: Written) -> bool:
    """Whether the folder entry is a plain file of the ``written`` names (or one's temporary)."""
    name = entry.name
    named = written.fullmatch(name) is not None if isinstance(written, re.Pattern) else name in written
    return entry.is_file(follow_symlinks=False) and (named or is_temporary_of(name, written))


def foreign_files(folder: str | os.PathLike, written: Written) -> list[str]:
    """The entries of ``folder`` that are not files of the ``written`` names (sorted names)."""
    return sorted(e.name for e in os.scandir(folder) if not is_written_file(e, written))


#: a Zarr v3 node's metadata, or the temporary of Zarr's atomic write of it (``zarr.<hex>.partial``)
_ZARR_META = re.compile(r"zarr\.json|zarr\.[0-9a-f]{32}\.partial")
#: a component of a Zarr chunk key (``c/3/0/0``), or the temporary of a chunk's write
_ZARR_CHUNK = re.compile(r"\d+(?:\.[0-9a-f]{32}\.partial)?")


def zarr_foreign_entries(folder: str | os.PathLike, arrays: Iterable[str],
                         beside: re.Pattern[str] | None = None) -> list[str]:
    """The entries of the Zarr v3 group ``folder`` its writer did not make (paths relative to it, sorted).

    A writer makes the group's metadata, the ``arrays`` (names such as ``fne/raw``: the groups on their
    path, each array's ``zarr.json`` and its chunk tree ``c/`` of numbered folders and files) and, beside
    them at the top, files whose names ``beside`` matches. Anything else (a ``NOTES.txt`` at any depth, a
    symbolic link, a folder of another name) is the user's: a writer that replaces the group refuses while
    it is there, as ``prep`` does for a prepared dataset.
    """
    tree: dict[str, dict | None] = {}
    for name in arrays:
        *groups, last = name.split("/")
        node = tree
        for group in groups:
            if node.get(group) is None:
                node[group] = {}
            node = node[group]
        node.setdefault(last, None)
    return sorted(_foreign_in_group(Path(folder), tree, "", beside))


def _foreign_in_group(folder: Path, tree: dict[str, dict | None], prefix: str,
                      beside: re.Pattern[str] | None) -> Iterator[str]:
    written = re.compile(f"{_ZARR_META.pattern}|{beside.pattern}") if beside is not None else _ZARR_META
    for name in foreign_files(folder, written):
        entry = folder / name
        if name not in tree or not entry.is_dir() or entry.is_symlink():
            yield prefix + name
        elif tree[name] is None:
            yield from _foreign_in_array(entry, f"{prefix}{name}/")
        else:
            yield from _foreign_in_group(entry, tree[name] or {}, f"{prefix}{name}/", None)


def _foreign_in_array(folder: Path, prefix: str) -> Iterator[str]:
    for name in foreign_files(folder, _ZARR_META):
        chunks = folder / name
        if name != "c" or not chunks.is_dir() or chunks.is_symlink():
            yield prefix + name
            continue
        for root, dirs, files in os.walk(chunks):
            for entry in (*dirs, *files):
                path = os.path.join(root, entry)
                if not _ZARR_CHUNK.fullmatch(entry) or os.path.islink(path):
                    yield prefix + os.path.relpath(path, folder)
            dirs[:] = [d for d in dirs
                       if _ZARR_CHUNK.fullmatch(d) and not os.path.islink(os.path.join(root, d))]


def is_run_folder(path: str | os.PathLike) -> bool:
    """Whether the folder holds a run: its :data:`RUN_MARKER`, or (a run written before the marker) its
    ``config.json`` beside a ``checkpoints/`` folder holding only the checkpoints train writes."""
    path = Path(path)
    try:
        if (path / RUN_MARKER).is_file():
            return True
        checkpoints = path / RUN_CHECKPOINTS
        return ((path / RUN_CONFIG).is_file() and checkpoints.is_dir()
                and not foreign_files(checkpoints, RUN_CHECKPOINT_FILES))
    except OSError:
        return False


def _resolved(path: str | os.PathLike) -> Path:
    """``path`` made absolute with every symlink followed (a missing tail is kept as given)."""
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


def artifact_kind(path: str | os.PathLike) -> str | None:
    """Which toolkit artifact the folder ``path`` is: :data:`PREPARED`, :data:`STORE`, :data:`RUN` or None."""
    path = Path(path)
    try:
        if not path.is_dir():
            return None
        if (path / PREPARED_MARKER).is_file():
            return PREPARED
        if is_run_folder(path):
            return RUN
        if (path / "zarr.json").is_file() and _is_toolkit_store(path / "zarr.json"):
            return STORE
        if (path / "prep.json").is_file() and (path / "dataset.json").is_file():
            return PREPARED
    except OSError:
        return None
    return None


def _is_toolkit_store(zarr_json: Path) -> bool:
    try:
        meta = read_json(zarr_json, "a Zarr group's metadata", most=1 << 24)
    except UserError:  # not a store's metadata (a FIFO, too large, not JSON): no store of this toolkit
        return False
    return isinstance(meta, dict) and meta.get("node_type") == "group"


def enclosing_artifact(path: str | os.PathLike) -> tuple[Path, str] | None:
    """The innermost artifact folder that holds ``path`` (``path`` itself included), with its kind."""
    here = _resolved(path)
    for folder in (here, *here.parents):
        kind = artifact_kind(folder)
        if kind is not None:
            return folder, kind
    return None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_not_input(path: str | os.PathLike, inputs: Iterable[str | os.PathLike | None],
                    option: str = "--out") -> None:
    """Refuse an output ``path`` that is one of ``inputs`` or lies inside an input folder (one line)."""
    out = _resolved(path)
    for item in inputs:
        if item is None:
            continue
        src = _resolved(item)
        if out == src or (src.is_dir() and _inside(out, src)):
            raise UserError(f"{option} {path}: is an input of this command ({item}); "
                            "write the output somewhere else")


def check_output_file(path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike | None] = (),
                      overwrite: bool = False, owner: str | os.PathLike | None = None,
                      option: str = "--out") -> Path:
    """Check that the command may write the file ``path``; returns it as given.

    Args:
        path: the file the command is about to write (atomically).
        inputs: files and folders the command reads: the output may be none of them, nor inside one.
        overwrite: an existing file is replaced only then (``--overwrite``).
        owner: the artifact folder this command writes (a run directory for ``train evaluate``):
            ``path`` may lie inside it, but inside no other artifact.
        option: the option that named ``path``, for the message.
    """
    check_not_input(path, inputs, option)
    out = _resolved(path)
    if out == Path(out.anchor):
        raise UserError(f"{option} {path}: is the file system root; give a file name")
    if out.is_dir():
        raise UserError(f"{option} {path}: is a folder; give a file name")
    _check_artifact(out, path, owner, option)
    if (out.exists() or Path(path).is_symlink()) and not overwrite:
        raise UserError(f"{option} {path}: exists; add --overwrite to replace it")
    return Path(path)


def check_output_folder(path: str | os.PathLike, names: Iterable[str], *,
                        inputs: Iterable[str | os.PathLike | None] = (), overwrite: bool = False,
                        owner: str | os.PathLike | None = None, option: str = "--out") -> Path:
    """Check that the command may write the files ``names`` into the folder ``path``; returns it.

    The folder may exist and hold other files (they are kept); a file of ``names`` that exists is
    replaced only with ``overwrite``. ``path`` may be no input of the command, not ``/``, not a file,
    and lie inside no toolkit artifact but ``owner``.
    """
    check_not_input(path, inputs, option)
    out = _resolved(path)
    if out == Path(out.anchor):
        raise UserError(f"{option} {path}: is the file system root; give a folder of its own")
    if os.path.islink(path) and not out.exists():
        # a dangling link: the folder would be made where it points, or the link replaced by it
        raise UserError(f"{option} {path}: is a symbolic link to {os.readlink(path)}, which does not exist; "
                        "remove the link or give another folder")
    if out.exists() and not out.is_dir():
        raise UserError(f"{option} {path}: exists and is not a folder")
    _check_artifact(out, path, owner, option)
    if not overwrite:
        there = [n for n in names if (out / n).exists() or (out / n).is_symlink()]
        if there:
            more = f" and {len(there) - 3} more" if len(there) > 3 else ""
            raise UserError(f"{option} {path}: already holds {', '.join(there[:3])}{more}; "
                            "add --overwrite to replace them")
    return Path(path)


def _check_artifact(out: Path, given: str | os.PathLike, owner: str | os.PathLike | None,
                    option: str) -> None:
    found = enclosing_artifact(out)
    if found is None:
        return
    folder, kind = found
    if owner is not None and folder == _resolved(owner):
        return
    raise UserError(f"{option} {given}: lies inside the {kind} {folder}, which this command does not "
                    "write; write the output somewhere else")
