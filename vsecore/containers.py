"""Numpy containers (``.npy`` files, ``.npz`` archives) read only from checked headers; caches that carry a
digest of their own content.

Why: ``np.load`` believes a file. A member whose header declares shape ``(10**11,)`` is allocated before
anything else is looked at (a MemoryError traceback), and a 3 GiB member deflated to 3 MB is inflated whole
before the caller's own checks can refuse it. Here, before any data is read:

1. an archive's member names are checked against what the caller expects (none missing, none more, none
   twice), and its entries: stored uncompressed unless the caller allows compression, a stored entry no
   larger than the file holding it, no encryption;
2. every header is read on its own, its length bounded (:data:`MAX_HEADER_BYTES`), and checked: a dtype the
   caller allows (never Python objects: no pickle is ever read), the declared shape against the caller's
   (:class:`Member`): exact lengths, or named dimensions that agree across members and stay within the
   bounds the caller knows (a dataset's caption count, the bytes of its ``dataset.json``);
3. the declared data bytes against what holds them: a ``.npy`` file's size, an archive entry's size (so a
   deflated member is never inflated past what its header declared).

Only then is a member read, into an array of exactly its declared size, in bounded chunks.

Digests: :func:`write_npz` adds a member ``digest``, the SHA-256 of every other member (its name, then its
``.npy`` bytes, in name order); :func:`read_npz` with ``digest=True`` recomputes it over the bytes it reads
anyway and refuses an archive whose content does not match (:class:`DigestMismatch`), or that has no
digest (:class:`NoDigest`: made before digests). It is a check against damage and against edits by tools
that do not know the format (bit rot, an array rewritten with ``np.savez``), not a signature: whoever
rewrites the digest too is believed. Every refusal is a :class:`ContainerError` whose text is one phrase.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from vsecore.io import NotRegularFile, atomic_file, open_regular_file

#: the longest ``.npy`` header read (numpy's own bound on what it parses)
MAX_HEADER_BYTES = 10000
#: the bytes read (and hashed) at a time
CHUNK_BYTES = 1 << 20
#: the member of an archive holding the SHA-256 of the others
DIGEST = "digest"
_MAGIC = b"\x93NUMPY"
_LENGTH_FORMATS = {1: "<H", 2: "<I", 3: "<I"}
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the same arrays give the same bytes
#: what zipfile raises on a malformed archive besides OSError
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OverflowError, struct.error, EOFError,
               NotImplementedError, KeyError, UnicodeDecodeError, RuntimeError)


class ContainerError(ValueError):
    """A container refused before or while being read: the text is one phrase naming what is wrong."""


class NoDigest(ContainerError):
    """An archive expected to carry a digest has none (one written before digests were)."""


class DigestMismatch(ContainerError):
    """An archive's content does not match the digest it carries."""


Dim = int | str


@dataclass(frozen=True)
class Member:
    """What one array must be: a dtype equal to one of ``dtypes`` or of a kind in ``kinds`` (numpy's
    letters: ``"iuf"``), and ``shape``: per dimension an exact length (int) or a name (``"n"``, ``"n+1"``):
    every member naming ``n`` must agree on it, and it may not exceed the bound the reader is given for
    it. ``optional``: an archive may leave it out."""

    dtypes: tuple[str, ...] = ()
    kinds: str = ""
    shape: tuple[Dim, ...] = ("n",)
    optional: bool = False

    def allows(self, dtype: np.dtype) -> bool:
        """Whether ``dtype`` is one this member may have."""
        return any(dtype == np.dtype(d) for d in self.dtypes) or dtype.kind in tuple(self.kinds)

    def describe(self) -> str:
        """The dtypes and shape expected, for a phrase."""
        what = "/".join([*(np.dtype(d).name for d in self.dtypes), *(f"kind {k}" for k in self.kinds)])
        return f"{what} {tuple(self.shape)}"


_DIGEST_MEMBER = Member(dtypes=("uint8",), shape=(32,))


@dataclass(frozen=True)
class NpyHeader:
    """A ``.npy`` header as read: ``shape``, ``dtype``, ``fortran_order``, and ``raw``: its bytes, magic
    included (the data starts ``len(raw)`` bytes in)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    raw: bytes

    @property
    def nbytes(self) -> int:
        """The data bytes the header declares."""
        count = 1
        for d in self.shape:
            count *= d
        return count * self.dtype.itemsize


def one_line(exc: BaseException, most: int = 160) -> str:
    """``Type: message`` of ``exc`` on one line, at most ``most`` characters of message."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:most]}{'...' if len(text) > most else ''}"


def _exact(fh: IO[bytes], n: int, what: str) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise ContainerError(f"ends inside its {what}")
    return data


def read_npy_header(fh: IO[bytes]) -> NpyHeader:
    """The header at the position of ``fh`` (a ``.npy`` file or archive member), read on its own: the magic,
    a length of at most :data:`MAX_HEADER_BYTES`, then numpy's parse of that many bytes. Refuses dtypes of
    Python objects, of fields or sub-arrays, of no size, and negative lengths."""
    magic = _exact(fh, 8, "magic")
    if magic[:6] != _MAGIC:
        raise ContainerError("not .npy data (no magic)")
    major, minor = magic[6], magic[7]
    if major not in _LENGTH_FORMATS or minor != 0:
        raise ContainerError(f".npy version {major}.{minor}, not one numpy writes")
    fmt = _LENGTH_FORMATS[major]
    length_bytes = _exact(fh, struct.calcsize(fmt), "header length")
    length = struct.unpack(fmt, length_bytes)[0]
    if length > MAX_HEADER_BYTES:
        raise ContainerError(f"a header of {length:,} bytes, more than {MAX_HEADER_BYTES:,}")
    raw = magic + length_bytes + _exact(fh, length, "header")
    parse = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    buffer = io.BytesIO(raw)
    buffer.seek(8)
    try:
        shape, fortran_order, dtype = parse(buffer, max_header_size=MAX_HEADER_BYTES)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError, OverflowError) as exc:
        raise ContainerError(f"an unreadable header ({one_line(exc, 80)})") from None
    if dtype.hasobject:
        raise ContainerError("holds Python objects (pickles are never read)")
    if dtype.fields is not None or dtype.subdtype is not None or dtype.itemsize == 0:
        raise ContainerError(f"dtype {dtype.str}: records, sub-arrays and empty items are not arrays here")
    if any(d < 0 for d in shape):
        raise ContainerError(f"negative shape {tuple(shape)}")
    return NpyHeader(tuple(shape), dtype, bool(fortran_order), raw)


def check_header(name: str, header: NpyHeader, member: Member, bounds: Mapping[str, int],
                 seen: dict[str, tuple[str, int]]) -> None:
    """Refuse ``header`` (of the array ``name``) unless it is what ``member`` says: dtype, number of
    dimensions, exact lengths; a named dimension (``"n"``, ``"n+1"``) must equal the value ``seen`` gave it
    (by another array; recorded there when first met) and stay within ``bounds[n]`` (no bound: any)."""
    if not member.allows(header.dtype):
        raise ContainerError(f"array {name} is {header.dtype.str} where {member.describe()} is expected")
    if len(header.shape) != len(member.shape):
        raise ContainerError(f"array {name} has shape {header.shape} where {member.describe()} is expected")
    for want, got in zip(member.shape, header.shape, strict=True):
        if isinstance(want, int):
            if got != want:
                raise ContainerError(f"array {name} has shape {header.shape} where {member.describe()} is "
                                     "expected")
            continue
        symbol, _, plus = want.partition("+")
        value = got - int(plus or 0)
        most = bounds.get(symbol)
        if value < 0:
            raise ContainerError(f"array {name} declares shape {header.shape}, too short for {want}")
        if most is not None and value > most:
            raise ContainerError(f"array {name} declares shape {header.shape}: {symbol} = {value:,}, more "
                                 f"than the {most:,} this data allows")
        other = seen.setdefault(symbol, (name, value))
        if other[1] != value:
            raise ContainerError(f"arrays {other[0]} and {name} disagree on {symbol} ({other[1]:,} and "
                                 f"{value:,})")


def read_data(fh: IO[bytes], header: NpyHeader, digest: Any = None) -> np.ndarray:
    """The array ``header`` declares, read from ``fh`` (just past the header) in chunks of
    :data:`CHUNK_BYTES` into an array of exactly that size (``digest``: a hash updated with every byte)."""
    raw = np.empty(header.nbytes, dtype=np.uint8)
    view = memoryview(raw)
    done = 0
    while done < header.nbytes:
        got = fh.readinto(view[done: done + CHUNK_BYTES])
        if not got:
            raise ContainerError(f"ends after {done:,} of the {header.nbytes:,} data bytes declared")
        if digest is not None:
            digest.update(view[done: done + got])
        done += got
    return raw.view(header.dtype).reshape(header.shape, order="F" if header.fortran_order else "C")


@contextmanager
def open_regular(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """``path`` opened to read bytes if it is a regular file (:func:`vsecore.io.open_regular_file`; a FIFO,
    device or socket is a :class:`ContainerError`). OSError as ``open`` raises it."""
    try:
        fh = open_regular_file(path)
    except NotRegularFile as exc:
        raise ContainerError(exc.strerror) from None
    with fh:
        yield fh


def npy_header(path: str | os.PathLike, member: Member | None = None,
               bounds: Mapping[str, int] | None = None) -> NpyHeader:
    """The header of the ``.npy`` file ``path``, checked against ``member`` and ``bounds`` when given and
    against the file's size (a header declaring more data than the file holds is refused)."""
    with open_regular(path) as fh:
        return _checked_npy(fh, member, bounds)


def _checked_npy(fh: IO[bytes], member: Member | None, bounds: Mapping[str, int] | None) -> NpyHeader:
    header = read_npy_header(fh)
    if member is not None:
        check_header("", header, member, bounds or {}, {})
    holds = os.fstat(fh.fileno()).st_size - len(header.raw)
    if header.nbytes > holds:
        raise ContainerError(f"the header declares {header.dtype.str} {header.shape} ({header.nbytes:,} "
                             f"bytes) but the file holds {holds:,} after it")
    return header


def read_npy(path: str | os.PathLike, member: Member | None = None,
             bounds: Mapping[str, int] | None = None) -> np.ndarray:
    """The array of the ``.npy`` file ``path``, read only once its header is checked (:func:`npy_header`)."""
    with open_regular(path) as fh:
        return read_data(fh, _checked_npy(fh, member, bounds))


def _by_name(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """The archive's entries by member name (``x.npy`` is member ``x``), none twice."""
    by_name: dict[str, zipfile.ZipInfo] = {}
    for info in zf.infolist():
        name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        if name in by_name:
            raise ContainerError(f"member {name} twice")
        by_name[name] = info
    return by_name


def _entries(zf: zipfile.ZipFile, expected: Mapping[str, Member], digest: bool) -> dict[str, zipfile.ZipInfo]:
    """The archive's entries by member name, refused unless they are the members expected."""
    by_name = _by_name(zf)
    wanted = set(expected) | ({DIGEST} if digest else set())
    unexpected = sorted(set(by_name) - wanted)
    if digest and DIGEST not in by_name and not unexpected:
        raise NoDigest("no digest of its content (written before digests)")
    missing = sorted(n for n in wanted - set(by_name) if n == DIGEST or not expected[n].optional)
    if unexpected or missing:
        raise ContainerError(f"members {unexpected or missing} {'not expected' if unexpected else 'missing'}")
    return by_name


def _check_entry(name: str, info: zipfile.ZipInfo, file_size: int, compressed: bool) -> None:
    if info.flag_bits & 0x1:
        raise ContainerError(f"member {name} is encrypted")
    allowed = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) if compressed else (zipfile.ZIP_STORED,)
    if info.compress_type not in allowed:
        raise ContainerError(f"member {name} is compressed (method {info.compress_type}); only stored "
                             "members are read here" if not compressed else
                             f"member {name} uses compression method {info.compress_type}")
    if info.compress_type == zipfile.ZIP_STORED and (info.file_size != info.compress_size
                                                     or info.compress_size > file_size):
        raise ContainerError(f"member {name} declares {info.file_size:,} bytes stored in a file of "
                             f"{file_size:,}")


def _entry_headers(zf: zipfile.ZipFile, entries: Mapping[str, zipfile.ZipInfo], file_size: int,
                   compressed: bool, expected: Mapping[str, Member] | None = None,
                   bounds: Mapping[str, int] | None = None) -> dict[str, NpyHeader]:
    """Every entry's header, read on its own: the entry checked (:func:`_check_entry`), the header against
    ``expected`` and ``bounds`` when given (:func:`check_header`), then the entry's size against the header's
    plus the data it declares (so a deflated entry is never inflated past it)."""
    headers: dict[str, NpyHeader] = {}
    seen: dict[str, tuple[str, int]] = {}
    for name in sorted(entries):
        info = entries[name]
        _check_entry(name, info, file_size, compressed)
        with zf.open(info) as member:
            try:
                header = read_npy_header(member)
            except ContainerError as exc:
                raise ContainerError(f"member {name}: {exc}") from None
        if expected is not None:
            member_of = _DIGEST_MEMBER if name == DIGEST else expected[name]
            check_header(name, header, member_of, bounds or {}, seen)
        if len(header.raw) + header.nbytes != info.file_size:
            raise ContainerError(f"member {name} holds {info.file_size:,} bytes, its header declares "
                                 f"{len(header.raw) + header.nbytes:,}")
        headers[name] = header
    return headers


@contextmanager
def _archive(path: str | os.PathLike) -> Iterator[tuple[zipfile.ZipFile, int]]:
    """``(the archive path, its size in bytes)``, what zipfile raises on a malformed one a ContainerError."""
    with open_regular(path) as fh:
        try:
            with zipfile.ZipFile(fh) as zf:
                yield zf, os.fstat(fh.fileno()).st_size
        except ContainerError:
            raise
        except _ZIP_ERRORS as exc:
            raise ContainerError(f"not a readable archive ({one_line(exc, 80)})") from None


def npz_headers(path: str | os.PathLike, compressed: bool = False) -> dict[str, NpyHeader]:
    """The header of every member of the ``.npz`` archive ``path``, by name, each read on its own and its
    entry checked (:func:`_entry_headers`); no data is read. For a caller that checks them itself, then
    reads with :func:`read_npz` and members pinned to what it checked."""
    with _archive(path) as (zf, file_size):
        return _entry_headers(zf, _by_name(zf), file_size, compressed)


def read_npz(path: str | os.PathLike, expected: Mapping[str, Member], bounds: Mapping[str, int],
             digest: bool = False, compressed: bool = False) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` archive ``path``, by name, read only once every member's entry and header
    is checked (the module docstring's order); with ``digest``, the archive's own digest verified over the
    bytes read (:func:`write_npz`). ``compressed``: deflated members are allowed (users' files; the caches
    never compress). A :class:`ContainerError` names the first thing wrong; OSError as ``open`` raises it."""
    with _archive(path) as (zf, file_size):
        entries = _entries(zf, expected, digest)
        headers = _entry_headers(zf, entries, file_size, compressed, expected, bounds)
        hasher = hashlib.sha256() if digest else None
        arrays = {name: _read_member(zf, entries[name], name, headers[name], hasher)
                  for name in sorted(entries) if name != DIGEST}
        if hasher is not None:
            recorded = _read_member(zf, entries[DIGEST], DIGEST, headers[DIGEST], None)
            if recorded.tobytes() != hasher.digest():
                raise DigestMismatch("its content does not match its digest")
        return arrays


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, header: NpyHeader,
                 hasher: Any) -> np.ndarray:
    with zf.open(info) as member:
        if member.read(len(header.raw)) != header.raw:
            raise ContainerError(f"member {name} changed while read")
        if hasher is not None:
            hasher.update(name.encode() + b"\0" + header.raw)
        try:
            array = read_data(member, header, hasher)
        except ContainerError as exc:
            raise ContainerError(f"member {name}: {exc}") from None
        if member.read(1):  # also the read that makes zipfile compare the entry's CRC-32
            raise ContainerError(f"member {name} holds bytes past its data")
    return array


class _Hashing:
    """A writable file that hashes what it passes on (what :func:`np.lib.format.write_array` writes)."""

    def __init__(self, fh: IO[bytes], hasher: Any) -> None:
        self.fh, self.hasher = fh, hasher

    def write(self, data: bytes) -> int:
        self.hasher.update(data)
        return self.fh.write(data)


def write_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], digest: bool = True) -> None:
    """Write ``arrays`` as the ``.npz`` archive ``path``: stored members in name order (fixed timestamps,
    so the same arrays give the same bytes), with ``digest`` a last member ``digest`` holding the SHA-256
    :func:`read_npz` checks; through a temporary sibling and a rename (a reader sees a whole file)."""
    if DIGEST in arrays:
        raise ValueError(f"an array may not be named {DIGEST!r}: that member holds the digest")
    hasher = hashlib.sha256()
    with atomic_file(path) as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(name + ".npy", date_time=_FIXED_TIME)
            with zf.open(info, "w", force_zip64=True) as member:
                hasher.update(name.encode() + b"\0")
                np.lib.format.write_array(_Hashing(member, hasher), np.asanyarray(arrays[name]),
                                          allow_pickle=False)
        if digest:
            with zf.open(zipfile.ZipInfo(DIGEST + ".npy", date_time=_FIXED_TIME), "w") as member:
                np.lib.format.write_array(member, np.frombuffer(hasher.digest(), dtype=np.uint8))

