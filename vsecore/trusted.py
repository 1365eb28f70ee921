"""The one rule for folders the toolkit runs code from: compiled kernels and any other code cache.

A folder whose files end up executed (Python modules an inductor cache imports, shared libraries it
loads, pickles it unpickles) is code, and is treated as such:

- :func:`trusted_folder`: the folder is created 0700 where missing and checked before use: it is not a
  symlink, it is ours and writable by nobody else; every folder above it (its real path, symlinks
  resolved) is ours or root's and writable by nobody else unless it is sticky (``/tmp``). Another
  user who could create, replace or write any of them could plant code that our process runs.
  :class:`UntrustedFolderError` (one line) names the folder and what failed.
- :func:`verified_cache`: a cache folder that verifies its own content. After a compilation, a
  manifest beside the folder records the SHA-256 of every file in it; before the next one, the
  files must still be exactly those. A file changed, added or removed since (a line appended to a
  cached module, a library swapped) means the cache is not believed: one warning line, the folder
  is emptied and the compiler starts afresh. A lock serialises verify, compile and record across
  processes (the test suite's workers compile into one folder).

The manifest guards against content this toolkit did not write; it is no defence against a program of
the same user that rewrites the manifest as well (such a program can edit the toolkit itself).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from vsecore.errors import UserError

#: the manifest's ``format`` field
MANIFEST_FORMAT = "vse-verified-cache-1"


class UntrustedFolderError(UserError):
    """A folder code would be run from fails :func:`trusted_folder`'s check (one line: folder and reason)."""


def _private_group(gid: int) -> bool:
    """Whether ``gid`` is our own user-private group (named as us, no other member): its write bit lets
    no one else in (what ``umask 002`` systems give every new folder)."""
    try:
        import grp
        import pwd

        me = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except (ImportError, KeyError, OSError):
        return False
    return gid == os.getegid() and group.gr_name == me and set(group.gr_mem) <= {me}


def _writable_by_others(st: os.stat_result) -> bool:
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and not _private_group(st.st_gid)


def _create(path: Path) -> None:
    """Make the missing folders of ``path`` one by one, each 0700 (an existing one is checked later)."""
    for part in [*reversed(path.parents), path]:
        if os.path.lexists(part):
            continue
        try:
            os.mkdir(part, 0o700)
        except FileExistsError:  # made by someone else meanwhile: the check decides about it
            pass
        except OSError as exc:
            raise UntrustedFolderError(f"{path}: cannot create {part}: {exc.strerror or exc}") from None


def _check_above(folder: Path, me: int) -> None:
    """Every folder above ``folder`` (a real path): ours or root's, writable by nobody else unless sticky."""
    for part in reversed(folder.parents):
        st = os.lstat(part)
        if stat.S_ISLNK(st.st_mode):  # replaced by a link since the path was resolved
            raise UntrustedFolderError(f"{folder}: {part} became a symlink while it was checked")
        if st.st_uid not in (me, 0):
            raise UntrustedFolderError(f"{folder}: {part} belongs to uid {st.st_uid}, not to you ({me}) or "
                                       "root, who alone may hold folders above code the toolkit runs")
        if _writable_by_others(st) and not st.st_mode & stat.S_ISVTX:
            raise UntrustedFolderError(f"{folder}: {part} is writable by others (mode "
                                       f"{stat.S_IMODE(st.st_mode):04o}, not sticky): anyone could replace "
                                       "what lies below it")


def trusted_folder(path: str | os.PathLike, create: bool = True) -> Path:
    """The real path of the folder ``path`` once it is fit to hold code the toolkit runs, else a one-line
    :class:`UntrustedFolderError`.

    Missing folders are made 0700 (``create``). ``path`` itself must not be a symlink; its real path is
    checked from ``/`` down and returned, so a link swapped later cannot redirect a caller that uses it:
    every folder above is ours or root's and not writable by group or others unless sticky (``/tmp``);
    the folder is ours, a folder, and not writable by group or others. Its read bits for group and others
    are taken away (0700): a folder of ours that nobody else can write is made private, not refused.
    """
    given = Path(os.path.abspath(path))
    me = os.geteuid()
    if create:
        _create(given)
    if os.path.islink(given):
        raise UntrustedFolderError(f"{given}: is a symlink (to {os.readlink(given)}); code is run only from "
                                   "a real folder")
    folder = Path(os.path.realpath(given))
    try:
        _check_above(folder, me)
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise UntrustedFolderError(f"{given}: no such folder") from None
    except NotADirectoryError:
        raise UntrustedFolderError(f"{given}: not a folder") from None
    except OSError as exc:
        raise UntrustedFolderError(f"{given}: cannot check it: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != me:
            raise UntrustedFolderError(f"{given}: belongs to uid {st.st_uid}, not to you ({me}); code is run "
                                       "only from a folder of your own")
        if _writable_by_others(st):
            mode = stat.S_IMODE(st.st_mode)
            raise UntrustedFolderError(f"{given}: is writable by others (mode {mode:04o}); anyone could have "
                                       "planted code in it")
        if st.st_mode & 0o077:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o700)
    finally:
        os.close(fd)
    return folder


# -- a cache that verifies its own content ------------------------------------------------------------------
def manifest_path(folder: str | os.PathLike) -> Path:
    """The manifest of the cache ``folder``: its hidden sibling ``.<name>.manifest.json``."""
    folder = Path(folder)
    return folder.with_name(f".{folder.name}.manifest.json")


def folder_content(folder: str | os.PathLike) -> dict[str, str]:
    """Every entry below ``folder`` (relative POSIX path) -> ``sha256:<hex>`` of a file, ``symlink:<target>``
    or ``special`` (a FIFO, socket or device); folders are walked, never followed through a link."""
    from vsecore.io import sha256_file

    folder = Path(folder)
    content: dict[str, str] = {}
    pending = [folder]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                name = Path(entry.path).relative_to(folder).as_posix()
                if entry.is_symlink():
                    content[name] = f"symlink:{os.readlink(entry.path)}"
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    content[name] = f"sha256:{sha256_file(entry.path)}"
                else:
                    content[name] = "special"
    return dict(sorted(content.items()))


def record_manifest(folder: str | os.PathLike) -> Path:
    """Write the manifest of ``folder``'s content now (atomically); returns its path."""
    from vsecore.io import write_json_atomic

    path = manifest_path(folder)
    write_json_atomic(path, {"format": MANIFEST_FORMAT, "files": folder_content(folder)})
    return path


def _recorded(folder: Path) -> dict[str, str] | None:
    """The manifest's files, or ``None`` where there is no manifest or it cannot be read as one."""
    from vsecore.jsonfile import read_json

    path = manifest_path(folder)
    if not os.path.lexists(path):
        return None
    try:
        data = read_json(path, "a cache manifest", most=64 << 20)
    except UserError:
        return None
    files = data.get("files") if isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT else None
    return files if isinstance(files, dict) else None


def content_problem(folder: str | os.PathLike) -> str | None:
    """Why the content of the cache ``folder`` is not what its manifest recorded, or ``None`` when it is
    (an empty folder needs no manifest)."""
    folder = Path(folder)
    now = folder_content(folder)
    recorded = _recorded(folder)
    if recorded is None:
        if not now:
            return None
        unreadable = " (unreadable)" if os.path.lexists(manifest_path(folder)) else ""
        return f"{len(now)} files but no manifest{unreadable} of what the toolkit compiled there"
    changed = sorted(k for k in now.keys() & recorded.keys() if now[k] != recorded[k])
    added = sorted(now.keys() - recorded.keys())
    removed = sorted(recorded.keys() - now.keys())
    if not (changed or added or removed):
        return None
    counts = ", ".join(f"{len(names)} {what}" for names, what in
                       ((changed, "changed"), (added, "added"), (removed, "removed")) if names)
    first = (changed or added or removed)[0]
    return f"{counts} since the toolkit compiled there (e.g. {first})"


def clear_folder(folder: str | os.PathLike) -> None:
    """Remove everything inside ``folder`` (links are removed, never followed) and its manifest."""
    with os.scandir(folder) as entries:
        for entry in list(entries):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(manifest_path(folder))


@contextlib.contextmanager
def _waiting_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``folder``'s lock file (``vsecore.io.lock_path``), waiting for another
    holder (a process compiling into it) to finish; unlocked on a file system without ``flock``."""
    import fcntl

    from vsecore.io import lock_path

    path = lock_path(folder)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise UntrustedFolderError(f"{folder}: cannot open its lock file {path}: "
                                   f"{exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UntrustedFolderError(f"{folder}: its lock file {path} is not a regular file")
        with contextlib.suppress(OSError):  # e.g. ENOLCK on a network file system: go on unlocked
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def verified_cache(folder: str | os.PathLike, what: str = "compiled code") -> Iterator[Path]:
    """Hold the cache ``folder`` for a compilation (or a load) of ``what``: yields its trusted real path.

    Both the folder and the one above it (where the manifest and the lock live) must pass
    :func:`trusted_folder` (:class:`UntrustedFolderError` otherwise). Under the folder's lock, its content
    is verified against the manifest; if it differs, one warning line says why and the folder is emptied
    before the block runs. When the block ends, in any way, the manifest records what is there: what this
    process's compiler wrote while holding the lock.
    """
    from vsecore import console

    given = Path(os.path.abspath(folder))
    path = trusted_folder(trusted_folder(given.parent) / given.name)
    with _waiting_lock(path):
        problem = content_problem(path)
        if problem is not None:
            console.warning(f"warning: {path}: not using this cache of {what}: {problem}; emptied it, "
                            "compiling afresh")
            clear_folder(path)
        try:
            yield path
        finally:
            record_manifest(path)
