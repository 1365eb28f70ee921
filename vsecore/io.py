"""Atomic writes shared by every stage: nothing half-written is ever left under a final name."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    """The process's file-creation mask (read by setting it and back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _host_tag() -> str:
    """This machine's name as it appears in temporary file names (no dots, no separators)."""
    import socket

    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40] or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def remove_dead_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary siblings of the file ``path`` left by :func:`atomic_file` writers that died.

    Only temporaries of this machine whose process no longer exists are removed (a live writer's,
    or another machine's on a shared file system, are left alone); returns what was removed. The
    ``.NAME.PID.tmp`` names of the writers before this scheme (``features export``) count as this
    machine's.
    """
    path = Path(path)
    name, host = re.escape(path.name), re.escape(_host_tag())
    pattern = re.compile(rf"\.{name}\.(?:{host}-(?P<pid>\d+)\.[A-Za-z0-9_]+|(?P<old>\d+))\.tmp")
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            match = pattern.fullmatch(entry.name)
            pid = int(match["pid"] or match["old"]) if match else 0
            if match and entry.is_file(follow_symlinks=False) and not _alive(pid):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` for writing; on success fsync it and rename it to ``path``.

    On any exception (Ctrl-C and SIGTERM included, see :class:`vsecore.errors.Terminated`) the temporary
    file is removed and ``path`` is left as it was, so a reader (or a run killed at any instant) only
    ever sees a complete file. The temporary's name carries the host and pid of its writer
    (``.NAME.HOST-PID.XXXX.tmp``), so the next writer of ``path`` removes those of writers that were
    killed (:func:`remove_dead_temporaries`). The file gets the permissions of one made by ``open``
    (0666 less the umask), not the temporary file's private 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_host_tag()}-{os.getpid()}.", suffix=".tmp",
                               dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class DeferredInterrupts:
    """Ctrl-C and SIGTERM noted while a block runs, raised at the writer's next :meth:`check`.

    For writers that call into a library which cannot take an exception at an arbitrary instant
    (HDF5 through h5py: a ``KeyboardInterrupt`` raised inside its callbacks is printed as "Exception
    ignored" and lost, and the command goes on). See :func:`deferred_interrupts`.
    """

    def __init__(self) -> None:
        self.signum: int | None = None

    def _note(self, signum: int, frame: object) -> None:
        if self.signum is None or signum == signal.SIGTERM:
            self.signum = signum

    def check(self) -> None:
        """Raise :class:`KeyboardInterrupt` (or :class:`vsecore.errors.Terminated`) if one arrived."""
        from vsecore.errors import Terminated

        if self.signum == signal.SIGTERM:
            raise Terminated()
        if self.signum is not None:
            raise KeyboardInterrupt()


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[DeferredInterrupts]:
    """While the block runs, SIGINT and SIGTERM only set a flag; call ``check()`` at safe points.

    The previous handlers come back when the block ends, and a signal noted but never checked is
    raised then (when the block itself ended without an exception). A signal the process ignores
    stays ignored; outside the main thread (where handlers cannot be set) ``check()`` never raises
    and signals keep their usual effect.
    """
    state = DeferredInterrupts()
    previous: dict[int, Any] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) != signal.SIG_IGN:  # e.g. nohup, a background job: stays ignored
                previous[signum] = signal.signal(signum, state._note)
    except ValueError:  # not the main thread
        pass
    try:
        yield state
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    state.check()


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file and an atomic rename.

    The text is made in one piece (``json.dumps``): without ``indent`` that is the C encoder, several
    times faster than ``json.dump``'s streaming one on a large dataset, and the same bytes."""
    text = json.dumps(obj, ensure_ascii=False, indent=indent)
    with atomic_file(path, "w") as fh:
        fh.write(text)
        fh.write("\n")


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces ``final`` in one rename.

    On any exception the temporary directory is removed and ``final`` is left as it was. The
    directory gets the permissions of one made by ``mkdir`` (0777 less the umask), not 0700. An existing
    ``final`` is swapped with the new folder in one step where the system can (:func:`exchange`), so a
    reader never finds it missing; elsewhere it is renamed aside first (``.<name>.old-PID``).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        tmp.chmod(0o777 & ~_umask())
        yield tmp
        if final.exists():
            if not overwrite:
                raise FileExistsError(final)
            if exchange(tmp, final):  # one step: ``final`` names the old or the new folder, never nothing
                shutil.rmtree(tmp, ignore_errors=True)  # now the old folder
                return
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


#: ``renameat2``'s flag that swaps two paths (Linux 3.15+, glibc 2.28+)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap the paths ``a`` and ``b`` in one atomic step (Linux ``renameat2`` with ``RENAME_EXCHANGE``):
    True when done; False where the system or the file system cannot (then nothing changed). Any other
    failure raises ``OSError``."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # not supported here: the caller renames twice
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def stale_siblings(final: str | os.PathLike) -> list[Path]:
    """Temporary siblings of ``final`` that :func:`atomic_directory` leaves when its process is killed.

    They are ``.<name>.XXXXXXXX.partial`` (the folder being written) and ``.<name>.old-PID`` (the
    previous ``final``, between the two renames). Names of other targets never match, even those
    starting with ``<name>.``. Only a holder of :func:`exclusive_lock` on ``final`` may remove
    them: then no live writer owns them.
    """
    final = Path(final)
    pattern = re.compile(rf"\.{re.escape(final.name)}\.(?:[a-z0-9_]{{8}}\.partial|old-\d+)")
    if not final.parent.is_dir():
        return []
    return sorted(p for p in final.parent.iterdir()
                  if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink())


def remove_stale_siblings(final: str | os.PathLike) -> list[Path]:
    """Delete :func:`stale_siblings` of ``final`` (call it holding its lock); returns what was removed."""
    removed = stale_siblings(final)
    for path in removed:
        shutil.rmtree(path)
    return removed


#: the largest text input read whole: a dataset's annotation JSON (COCO's captions_train2014.json is 80 MB,
#: Karpathy's dataset_coco.json 140 MB); smaller bounds where a file is small by nature (configurations)
MAX_TEXT_BYTES = 1 << 30


def regular_file_size(path: str | os.PathLike, most: int, what: str) -> int:
    """The size of ``path``, or a one-line UserError unless it is a regular file (links followed) of at
    most ``most`` bytes: a FIFO would block the reader, ``/dev/zero`` never end, a huge file fill memory."""
    from vsecore.errors import UserError

    try:
        st = os.stat(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    _check_regular(path, st, most, what)
    return st.st_size


def _check_regular(path: str | os.PathLike, st: os.stat_result, most: int, what: str) -> None:
    from vsecore.errors import UserError

    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{path}: is a folder, expected {what}")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{path}: {what} is not a regular file (a FIFO, device or socket); refusing to "
                        "read it")
    if st.st_size > most:
        raise UserError(f"{path}: {what} is {st.st_size:,} bytes, more than the {most:,} it may have")


def read_bytes(path: str | os.PathLike, expected: str = "a file", missing: str | None = None,
               most: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of the file ``path``, or :func:`read_text`'s one-line :class:`UserError` (missing, a folder,
    not a regular file, more than ``most`` bytes, not readable): what a reader keeps whole to hash it (a
    prepared ``dataset.json``) reads through this, the checks of every text input."""
    from vsecore.errors import UserError

    try:
        with open_regular(path, expected, missing, most) as fh:
            data = fh.read(most + 1)
    except OSError as exc:
        raise UserError(f"{path}: not readable ({exc.strerror or type(exc).__name__})") from None
    if len(data) > most:  # grew since the check
        raise UserError(f"{path}: {expected} is more than the {most:,} bytes it may have")
    return data


def read_text(path: str | os.PathLike, expected: str = "a text file", missing: str | None = None,
              most: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of the file ``path``, or a one-line :class:`UserError`: ``missing`` (default ``PATH: no
    such file``) when it does not exist, ``PATH: is a folder, expected EXPECTED``, not a regular file (a
    FIFO, a device such as ``/dev/zero``: refused without reading), more than ``most`` bytes, ``PATH: not
    UTF-8 text (REASON at byte N)``, or ``PATH: not readable (ERROR)``. The one reader of every command's
    text inputs (pipelines files, annotation JSON, a run's configuration), so they fail alike."""
    from vsecore.errors import UserError

    data = read_bytes(path, expected, missing, most)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


class LockedError(Exception):
    """Another live process holds the lock (its description is the message)."""


def lock_path(target: str | os.PathLike) -> Path:
    """The lock file of ``target``: the hidden sibling ``.<name>.lock``.

    A sibling, not a file inside ``target``: stores and prepared folders are replaced by a rename,
    and the lock must outlive that.
    """
    target = Path(target)
    return target.with_name(f".{target.name}.lock")


def _open_lock_file(path: Path, target: str | os.PathLike, what: str) -> int:
    """Open (creating it) the regular lock file ``path`` without following a symlink; UserError if not."""
    import stat

    from vsecore.errors import UserError

    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        try:
            kind = _file_kind(os.lstat(path).st_mode)
        except OSError:
            kind = None
        if kind is not None and kind != "regular file":
            raise UserError(f"{path}: the lock file of {target} is a {kind}, not a regular file; remove it "
                            f"(nothing else should be there) and run again") from None
        raise UserError(f"{target}: cannot create the lock file {path} for {what}: "
                        f"{exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UserError(f"{path}: the lock file of {target} is a {_file_kind(mode)}, not a regular file; "
                        "remove it and run again")
    return fd


def lock_holder(target: str | os.PathLike) -> str | None:
    """Who holds the writer lock of ``target`` (the line :func:`exclusive_lock` records), or ``None``.

    For readers: the lock file is never created, nor followed through a symlink, and only a
    momentary shared ``flock`` is tried (a writer that meets it looks again). ``None`` also when the
    lock cannot be tested (no lock file, a filesystem without ``flock``).
    """
    import fcntl

    try:
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(lock_path(target), flags)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 4096).decode("utf-8", "replace").strip() or "another process"
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    import stat

    for test, name in ((stat.S_ISLNK, "symlink"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device"),
                       (stat.S_ISREG, "regular file")):
        if test(mode):
            return name
    return "special file"


@contextlib.contextmanager
def exclusive_lock(target: str | os.PathLike, what: str = "this output") -> Iterator[Path]:
    """Hold an exclusive lock on ``target`` (a store, run directory or prepared folder) while writing it.

    The lock is an ``flock`` on :func:`lock_path`, so it is released by the kernel when its holder
    exits in any way, ``SIGKILL`` included: a lock file left by a killed run is stale and simply
    taken over. The file records the holder (pid, host, start time, command) for the error message.
    A second writer gets a :class:`vsecore.errors.UserError` at once, never a wait.

    The lock file is opened without following symlinks (``O_NOFOLLOW``) and must be a regular file: a
    symlink, directory or device planted at the lock path is a one-line error, never written through.
    A lock file that cannot be created (read-only filesystem, no permission, disk full) is one too.
    """
    import fcntl
    import socket
    import sys
    import time

    from vsecore.errors import UserError

    path = lock_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    attempts_left = 10
    while True:
        fd = _open_lock_file(path, target, what)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace").strip()
            os.close(fd)
            if not holder and attempts_left > 0:
                # no holder text: a reader's momentary shared lock (lock_holder), or a writer that has
                # not written its line yet; look again shortly
                attempts_left -= 1
                time.sleep(0.05)
                continue
            holder = holder or "another process"
            raise UserError(f"{target}: {what} is being written by {holder}; wait for it to finish "
                            f"(or stop it) and run again") from None
        except OSError:
            os.close(fd)  # a filesystem without flock: proceed unlocked rather than refuse all work
            yield path
            return
        try:  # the holder before us may have unlinked the file between our open and our lock
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        command = " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])[:200]
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {started} ({command})".encode())
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


class NotRegularFile(OSError):
    """A path that names a FIFO, a device or a socket: never read (a FIFO blocks, /dev/zero never ends)."""


def open_regular_file(path: str | os.PathLike) -> IO[bytes]:
    """``path`` opened to read bytes if it is a regular file (links followed); else ``IsADirectoryError``,
    :class:`NotRegularFile`, or the ``OSError`` of ``open`` (``FileNotFoundError``, ...). Nothing is read:
    the one opening of every bounded reader (:func:`open_regular`, :mod:`vsecore.containers`)."""
    # O_NONBLOCK: opening a FIFO does not wait for a writer; fstat then refuses it
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file (a FIFO, device or socket)", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_regular(path: str | os.PathLike, expected: str, missing: str | None, most: int) -> IO[bytes]:
    """``path`` opened to read bytes, or :func:`read_text`'s one-line UserError (missing: ``missing`` or
    ``PATH: no such file``; a folder, a FIFO or device, more than ``most`` bytes, not readable). The opening
    of every bounded reader of text: :func:`read_text`, :func:`vsecore.lines.open_lines`."""
    from vsecore.errors import UserError

    try:
        fh = open_regular_file(path)
    except FileNotFoundError:
        raise UserError(missing or f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, expected {expected}") from None
    except NotRegularFile:
        raise UserError(f"{path}: {expected} is not a regular file (a FIFO, device or socket); refusing to "
                        "read it") from None
    except OSError as exc:
        raise UserError(f"{path}: not readable ({exc.strerror or type(exc).__name__})") from None
    try:
        _check_regular(path, os.fstat(fh.fileno()), most, expected)
    except BaseException:
        fh.close()
        raise
    return fh
