"""The one checked reader of numpy containers (vsecore.containers): every header is read and checked (names,
dtypes, declared shapes against the caller's bounds, declared bytes against what holds them) before any
data is read, so a forged or bombed member is a ContainerError phrase, never an allocation; and an archive
written with a digest refuses content that does not match it.

Then the caches of a prepared dataset read through it, by the commands (issue 41.2, 41.3): a table of
hostile members x both caches (its rows, its encoded captions), each run as `train evaluate` in a
subprocess under an address-space cap, a time cap and a peak-memory bound (as tests/test_readers_hostile.py
runs its table) -> the command succeeds with one warning line per cache and both files are rebuilt; and
edits that every structural check passes (the text column; captions moved to other images) -> a warning,
the right captions, the right numbers.

The archives are forged entry by entry (:func:`write_zip`, :func:`rewrite_npz`), by hand where zipfile
cannot: :func:`zero_bomb` makes a deflated member of gigabytes from one compressed block in seconds."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import zipfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest
from dataset_reference import edit
from helpers import TINY, make_prepared, make_store

from prep import dataset_cache
from prep.dataset import PreparedDataset
from prep.dataset_cache import CACHE_ENV, ROWS_FILE, read_rows_cache, text_arrays, text_column
from prep.dataset_rows import TextColumn
from train.cli import build_parser
from train.engine.caption_cache import check_arrays
from train.engine.codecs import text_codec
from vsecore.containers import (
    DIGEST,
    ContainerError,
    DigestMismatch,
    Member,
    NoDigest,
    npy_header,
    npz_headers,
    read_npy,
    read_npz,
    write_npz,
)
from vsecore.errors import run_cli


# -- forging helpers ---------------------------------------------------------------------------------------
def header_bytes(descr: str, shape: tuple[int, ...], fortran: bool = False, version: int = 1) -> bytes:
    """A ``.npy`` header declaring ``descr`` and ``shape`` (whatever the data after it)."""
    buf = io.BytesIO()
    d = {"descr": descr, "fortran_order": fortran, "shape": shape}
    (np.lib.format.write_array_header_1_0 if version == 1 else np.lib.format.write_array_header_2_0)(buf, d)
    return buf.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    """The ``.npy`` bytes of ``array`` as ``np.save`` writes them."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


class Entry:
    """One archive entry written by :func:`write_zip`: ``data`` stored, or a raw deflate stream of
    ``size`` bytes of CRC-32 ``crc`` (``deflated``)."""

    def __init__(self, data: bytes, deflated: bool = False, size: int | None = None, crc: int | None = None):
        self.data, self.deflated = data, deflated
        self.size = len(data) if size is None else size
        self.crc = zlib.crc32(data) if crc is None else crc


def write_zip(path: Path, entries: Mapping[str, Entry]) -> None:
    """A plain (not zip64) zip archive of ``entries`` by file name, written by hand."""
    out, central = io.BytesIO(), io.BytesIO()
    for name, e in entries.items():
        raw, method = name.encode(), 8 if e.deflated else 0
        offset = out.tell()
        fields = (20, 0, method, 0, 33, e.crc, len(e.data), e.size, len(raw))
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, *fields, 0) + raw + e.data)
        central.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, *fields, 0, 0, 0, 0, 0, offset)
                      + raw)
    start, directory = out.tell(), central.getvalue()
    out.write(directory + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries),
                                      len(directory), start, 0))
    path.write_bytes(out.getvalue())


def rewrite_npz(path: Path, replace: Mapping[str, bytes | Entry | None]) -> None:
    """Rewrite the archive ``path``: every member keeps its bytes unless ``replace`` names it (None: left
    out; bytes: stored as its new ``.npy`` bytes; an :class:`Entry`: as it is); new names are added."""
    with zipfile.ZipFile(path) as zf:
        members: dict[str, bytes | Entry | None] = {i.filename[:-4]: zf.read(i) for i in zf.infolist()}
    members.update(replace)
    write_zip(path, {f"{k}.npy": v if isinstance(v, Entry) else Entry(v) for k, v in members.items()
                     if v is not None})


def zero_bomb(size: int, descr: str = "|u1") -> Entry:
    """A deflated member declaring ``size`` zero items of ``descr`` (a few MB for gigabytes): one 16 MiB
    block compressed after a full flush compresses alike every time, so it is compressed once."""
    header = header_bytes(descr, (size,))
    block = bytes(16 << 20)
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    head = c.compress(header) + c.flush(zlib.Z_FULL_FLUSH)
    whole = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    nbytes = size * np.dtype(descr).itemsize
    full, rest = divmod(nbytes, len(block))
    crc = zlib.crc32(header)
    for _ in range(full):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(block[:rest], crc)
    tail = c.compress(block[:rest]) + c.flush()
    return Entry(head + whole * full + tail, deflated=True, size=len(header) + nbytes, crc=crc)


# -- the reader --------------------------------------------------------------------------------------------
ARRAYS = {"ids": np.arange(6, dtype=np.int64), "starts": np.arange(7, dtype=np.int64),
          "text": np.frombuffer(b"a red dog", dtype=np.uint8),
          "grid": np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))}
EXPECTED = {"ids": Member(("int64",), shape=("n",)), "starts": Member(("int64",), shape=("n+1",)),
            "text": Member(("uint8",), shape=("t",)), "grid": Member(kinds="f", shape=(3, "w"))}
BOUNDS = {"n": 6, "t": 100, "w": 4}


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    path = tmp_path / "a.npz"
    write_npz(path, ARRAYS)
    return path


def test_what_is_written_is_read_back_checked_and_np_load_reads_it_too(archive: Path, tmp_path: Path) -> None:
    got = read_npz(archive, EXPECTED, BOUNDS, digest=True)
    for name, array in ARRAYS.items():
        assert got[name].dtype == array.dtype and np.array_equal(got[name], array), name
    assert got["grid"].flags.f_contiguous
    with np.load(archive, allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted([*ARRAYS, DIGEST])
    write_npz(tmp_path / "b.npz", dict(reversed(ARRAYS.items())))
    assert (tmp_path / "b.npz").read_bytes() == archive.read_bytes()  # the same arrays, the same bytes
    assert sorted(npz_headers(archive)) == sorted([*ARRAYS, DIGEST])
    assert read_npz(archive, {**EXPECTED, "more": Member(("int8",), optional=True)}, BOUNDS, digest=True)


#: (case, the members replaced in the written archive, the phrase of the refusal)
FORGED = [
    ("a member declaring shape (10**11,)", {"text": header_bytes("|u1", (10**11,)) + b"a red dog"},
     "t = 100,000,000,000, more than the 100"),
    ("a deflated member", {"text": Entry(zlib.compress(npy_bytes(ARRAYS["text"]))[2:-4], deflated=True,
                                         size=len(npy_bytes(ARRAYS["text"])),
                                         crc=zlib.crc32(npy_bytes(ARRAYS["text"])))},
     "member text is compressed"),
    ("an unexpected member", {"extra": npy_bytes(np.zeros(2))}, "members ['extra'] not expected"),
    ("a missing member", {"ids": None}, "members ['ids'] missing"),
    ("a wrong dtype", {"ids": npy_bytes(ARRAYS["ids"].astype(np.int32))}, "array ids is <i4"),
    ("a big-endian dtype", {"ids": npy_bytes(ARRAYS["ids"].astype(">i8"))}, "array ids is >i8"),
    ("a wrong number of dimensions", {"ids": npy_bytes(ARRAYS["ids"].reshape(2, 3))}, "has shape (2, 3)"),
    ("a wrong fixed length", {"grid": npy_bytes(np.zeros((4, 4), np.float32))}, "has shape (4, 4)"),
    ("lengths that disagree", {"starts": npy_bytes(np.arange(5))},
     "arrays ids and starts disagree on n (6 and 4)"),
    ("a length too short for n+1", {"starts": npy_bytes(np.arange(0))}, "too short for n+1"),
    ("a pickled object array", {"ids": npy_bytes(np.array([{"a": 1}], dtype=object))}, "Python objects"),
    ("a record dtype", {"ids": npy_bytes(np.zeros(6, dtype=[("a", "<i8")]))}, "records"),
    ("a header of 70 kB", {"ids": b"\x93NUMPY\x02\x00" + struct.pack("<I", 70000) + b" " * 70000},
     "a header of 70,000 bytes"),
    ("no magic", {"ids": b"PK" + bytes(100)}, "no magic"),
    ("a negative length", {"ids": header_bytes("<i8", (-1,))}, "negative shape"),
    ("an unknown version", {"ids": b"\x93NUMPY\x07\x00" + bytes(100)}, ".npy version 7.0"),
    ("bytes past the data", {"ids": npy_bytes(ARRAYS["ids"]) + b"x"}, "holds 177 bytes"),
    ("content edited", {"text": npy_bytes(np.frombuffer(b"a blu dog", np.uint8))},
     "does not match its digest"),
    ("no digest", {DIGEST: None}, "no digest of its content"),
]


@pytest.mark.parametrize("case,replace,phrase", FORGED, ids=[c[0] for c in FORGED])
def test_a_forged_member_is_refused_from_its_header_before_any_data_is_read(
        archive: Path, case: str, replace: dict, phrase: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rewrite_npz(archive, replace)
    with pytest.raises(ContainerError) as caught:
        read_npz(archive, EXPECTED, BOUNDS, digest=True)
    assert phrase in str(caught.value) and "\n" not in str(caught.value), (case, str(caught.value))
    assert isinstance(caught.value, DigestMismatch) == (case == "content edited")
    assert isinstance(caught.value, NoDigest) == (case == "no digest")


def test_a_deflated_bomb_is_refused_without_inflating_it(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bomb.npz"
    write_zip(path, {"text.npy": zero_bomb(3 << 30)})  # 3 GiB of zeros in about 3 MB
    assert path.stat().st_size < 8 << 20
    inflated = []
    real_empty = np.empty
    monkeypatch.setattr(np, "empty", lambda n, *a, **k: inflated.append(n) or real_empty(n, *a, **k))
    with pytest.raises(ContainerError, match="member text is compressed"):
        read_npz(path, {"text": EXPECTED["text"]}, BOUNDS)
    # where compression is allowed (users' files) the declared shape is still bounded first
    with pytest.raises(ContainerError, match="t = 3,221,225,472, more than the 100"):
        read_npz(path, {"text": EXPECTED["text"]}, BOUNDS, compressed=True)
    assert not inflated
    # a bomb whose entry inflates past its header is refused from the entry's size
    small = zero_bomb(1 << 20)
    small.size += 1
    write_zip(path, {"text.npy": small})
    declared = f"holds {small.size:,} bytes, its header declares {small.size - 1:,}"
    with pytest.raises(ContainerError, match=declared):
        read_npz(path, {"text": EXPECTED["text"]}, {}, compressed=True)
    # and with no bound, a stored member declaring more than its entry holds
    write_zip(path, {"ids.npy": Entry(header_bytes("<i8", (10**11,)) + bytes(48))})
    with pytest.raises(ContainerError, match="holds 176 bytes, its header declares 800,000,000,128"):
        read_npz(path, {"ids": EXPECTED["ids"]}, {})
    assert not inflated


def test_a_flipped_byte_and_a_truncated_archive_are_refused(archive: Path) -> None:
    data = bytearray(archive.read_bytes())
    at = data.index(b"a red dog")
    data[at] ^= 1
    archive.write_bytes(bytes(data))
    with pytest.raises(ContainerError, match="Bad CRC-32"):
        read_npz(archive, EXPECTED, BOUNDS, digest=True)  # zipfile's own CRC-32, before the digest
    archive.write_bytes(bytes(data[:300]))
    with pytest.raises(ContainerError, match="not a readable archive"):
        read_npz(archive, EXPECTED, BOUNDS, digest=True)


def test_npy_files_are_read_only_within_their_size(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.arange(12, dtype=np.float64).reshape(3, 4))
    member = Member(kinds="fi", shape=("rows", "d"))
    assert read_npy(path, member).shape == (3, 4) and npy_header(path).dtype == np.float64
    path.write_bytes(header_bytes("<f4", (10**7, 1000)) + bytes(1000))  # 40 GB declared on 1 KB
    with pytest.raises(ContainerError, match="the file holds 1,000 after it"):
        read_npy(path)
    path.write_bytes(header_bytes("<f4", (10**7, 1000), version=2) + bytes(1000))
    with pytest.raises(ContainerError, match="the file holds 1,000 after it"):
        npy_header(path)
    with pytest.raises(ContainerError, match="rows = 10,000,000, more than the 5"):
        npy_header(path, member, {"rows": 5})
    path.write_bytes(npy_bytes(np.array(["a"], dtype=object)))
    with pytest.raises(ContainerError, match="Python objects"):
        read_npy(path)


def test_special_files_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.npy"
    os.mkfifo(fifo)
    result: list[BaseException] = []

    def read() -> None:
        try:
            read_npy(fifo)
        except BaseException as exc:  # what it raised, for the main thread to check
            result.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive() and isinstance(result[0], ContainerError)
    assert "not a regular file" in str(result[0])
    with pytest.raises(ContainerError, match="not a regular file"):
        read_npz("/dev/zero", EXPECTED, BOUNDS)
    with pytest.raises(IsADirectoryError):
        read_npy(tmp_path)


def test_an_array_may_not_be_named_digest(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="may not be named"):
        write_npz(tmp_path / "x.npz", {DIGEST: np.zeros(1)})


def test_the_forging_helpers_write_what_zipfile_and_numpy_read(tmp_path: Path) -> None:
    path = tmp_path / "f.npz"
    write_zip(path, {"a.npy": Entry(npy_bytes(np.arange(3))), "b.npy": zero_bomb(100, "<i8")})
    with np.load(path) as npz:
        assert np.array_equal(npz["a"], np.arange(3)) and np.array_equal(npz["b"], np.zeros(100, np.int64))


# -- the caches of a prepared dataset through the commands (issue 41.2, 41.3) ------------------------------
#: the subprocess's address-space cap and time cap (as tests/test_readers_hostile.py's: torch's CUDA build
#: maps about 3 GiB of virtual memory at start)
MEMORY_CAP = 6 << 30
TIME_CAP = 60
#: the most memory a `train evaluate` of the tiny run below may take (about 1 GB: torch); reading the
#: 3 GiB member whole, as np.load did, passes it (or the address-space cap first)
PEAK_CAP = 2 << 30
CAPTION_MEMBERS = {"meta", "image_rows", "per_image", "offsets", "text_offsets", "text", "codes"}


def run_measured(args: tuple[str, ...], cwd: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess,
                                                                                  int]:
    """``python -m ARGS`` under the address-space and time caps, and the peak resident memory of that one
    process in bytes (``wait4``'s usage of it, not of every child this process waited for)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=err, preexec_fn=_limits,
                                   cwd=cwd, env=env)
        timer = threading.Timer(TIME_CAP, process.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            timer.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(args, process.returncode, out.read().decode(), err.read().decode())
    return done, usage.ru_maxrss * 1024


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def train(argv: list) -> int:
    """``train ...`` in process, through the console command's error wrapper."""
    def main(a: list[str]) -> int:
        args = build_parser().parse_args(a)
        return int(args.func(args) or 0)

    return run_cli(main, [str(a) for a in argv], "train")


@pytest.fixture(scope="module")
def cached_run(tmp_path_factory) -> dict[str, Path]:
    """A one-epoch run on a dataset whose rows are cached (its dataset.json over MIN_CACHED_BYTES), evaluated
    once: the caches it left (``pristine``: a VSE_CAPTION_CACHE folder) and its numbers (``numbers``)."""
    root = tmp_path_factory.mktemp("cached")
    data = make_prepared(root / "prepared", n_train=40, n_val=8, n_test=8)
    edit(data, lambda content: content.update(notes="x" * dataset_cache.MIN_CACHED_BYTES))
    store = make_store(root / "feats.zarr", data)
    run = root / "run"
    with pytest.MonkeyPatch.context() as m:
        m.setenv(CACHE_ENV, str(root / "pristine"))
        assert train(["chain", "--data", data, "--features", f"{store}:global", *TINY, "--epochs", "1",
                      "--out", run]) == 0
        assert train(["evaluate", "--run", run, "--device", "cpu", "--json", root / "numbers.json"]) == 0
    return {"data": data, "run": run, "pristine": root / "pristine", "numbers": root / "numbers.json"}


def copy_caches(cached_run: dict[str, Path], tmp_path: Path) -> tuple[Path, Path, Path]:
    """The run's caches copied for one test: (the folder for VSE_CAPTION_CACHE, its rows cache, the caption
    cache of the test split)."""
    caches = tmp_path / "caches"
    shutil.copytree(cached_run["pristine"], caches)
    folder = next(caches.iterdir())
    return caches, folder / ROWS_FILE, next(folder.glob("test.*.npz"))


def resave_keeping_the_digest(path: Path, change) -> None:
    """What a tool that does not know the digest does: load the arrays, change some, ``np.savez`` them all."""
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    change(arrays)
    np.savez(path.with_suffix(".tmp.npz"), **arrays)
    path.with_suffix(".tmp.npz").replace(path)


def shift_captions(arrays: dict[str, np.ndarray]) -> None:
    """Each image's captions onto the next image (the last one's onto the first): the per-image counts and
    the captions (codes, offsets, text) rolled alike, so every structural check still passes."""
    per_image, offsets, codes = arrays["per_image"], arrays["offsets"], arrays["codes"]
    texts = list(text_column(arrays["text"], arrays["text_offsets"], len(offsets) - 1))
    order = np.roll(np.arange(len(texts)), int(per_image[-1]))
    lengths = np.diff(offsets)[order]
    arrays["offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    arrays["codes"] = np.concatenate([codes[offsets[k]: offsets[k + 1]] for k in order])
    arrays["text"], arrays["text_offsets"] = text_arrays(TextColumn([texts[k] for k in order]))
    arrays["per_image"] = np.roll(per_image, 1)


@functools.lru_cache(maxsize=1)
def bomb() -> Entry:
    return zero_bomb(3 << 30)  # 3 GiB of zeros, about 3 MB deflated


def wrong_dtype(path: Path, member: str) -> dict[str, bytes]:
    with np.load(path) as npz:
        array = npz[member]
    return {member: npy_bytes(array.astype(np.int64 if array.dtype == np.int16 else np.int32))}


#: (case, the members it replaces in an archive and its member, (rows member, captions member), the phrase)
CACHE_CASES = [
    ("a member declaring shape (10**11,)",
     lambda path, member: {member: header_bytes("|u1", (10**11,)) + bytes(64)}, ("raws.text", "text"),
     "declares shape (100000000000,)"),
    ("a 3 GiB zero member deflated", lambda path, member: {member: bomb()}, ("raws.text", "text"),
     "is compressed"),
    ("an unexpected member", lambda path, member: {"extra": npy_bytes(np.zeros(3))}, ("starts", "codes"),
     "members ['extra'] not expected"),
    ("a member of the wrong dtype", wrong_dtype, ("starts", "codes"), "where int"),
]


@pytest.mark.parametrize("case,make,members,phrase", CACHE_CASES, ids=[c[0] for c in CACHE_CASES])
def test_a_hostile_cache_is_one_warning_then_rebuilt_under_the_memory_cap(
        cached_run: dict[str, Path], tmp_path: Path, case: str, make: Callable, members: tuple[str, str],
        phrase: str) -> None:
    """Issue 41.3: a member is checked from its header before it is read, and whatever a cache holds is a
    warning and a rebuild, never a traceback (the shape (10**11,) was a MemoryError, exit 1, and the file
    stayed, so every later command failed alike; the bomb took 3.9 GB and 57 s before it was refused)."""
    caches, rows, captions = copy_caches(cached_run, tmp_path)
    for path, member in zip((rows, captions), members, strict=True):
        rewrite_npz(path, make(path, member))
    env = {k: v for k, v in os.environ.items() if k != CACHE_ENV}
    done, peak = run_measured(("train", "evaluate", "--run", str(cached_run["run"]), "--device", "cpu"),
                              cwd=tmp_path, env={**env, CACHE_ENV: str(caches), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, (case, done.returncode, done.stderr[-3000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, (case, lines)
    assert lines[0].startswith(f"dataset cache {rows}: ") and lines[0].endswith("reading dataset.json again")
    assert lines[1].startswith(f"caption cache {captions}: ")
    assert lines[1].endswith("encoding the captions again")
    assert all(phrase in line for line in lines), (case, lines)
    assert peak < PEAK_CAP, (case, f"{peak / 2**30:.1f} GiB")
    # both files replaced by valid ones
    sha256 = hashlib.sha256((cached_run["data"] / "dataset.json").read_bytes()).hexdigest()
    assert isinstance(read_rows_cache(rows, sha256), tuple)
    headers = npz_headers(captions)
    assert set(headers) == CAPTION_MEMBERS | {DIGEST}
    read_npz(captions, {n: Member((h.dtype.str,), shape=h.shape) for n, h in headers.items() if n != DIGEST},
             {}, digest=True)


def test_a_text_column_edited_in_the_rows_cache_is_a_warning_and_the_right_captions(
        cached_run: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Issue 41.2: 'red' -> 'blu' in the rows cache's text (offsets still fit, the SHA-256 of dataset.json it
    records still matches) changed every exported caption, with no warning."""
    caches, rows, captions = copy_caches(cached_run, tmp_path)
    captions.unlink()  # the test captions are encoded again, from the rows the dataset load gives

    def red_to_blu(arrays: dict) -> None:
        arrays["raws.text"] = np.frombuffer(arrays["raws.text"].tobytes().replace(b"red", b"blu"), np.uint8)

    resave_keeping_the_digest(rows, red_to_blu)
    monkeypatch.setenv(CACHE_ENV, str(caches))
    capsys.readouterr()
    assert train(["export-embeddings", "--run", cached_run["run"], "--out", tmp_path / "exp"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"dataset cache {rows}: its content does not match its digest")
    content = json.loads((cached_run["data"] / "dataset.json").read_text())
    test = sorted(s["raw"] for im in content["images"] if im["split"] == "test" for s in im["sentences"])
    assert sorted(json.loads((tmp_path / "exp" / "test_ids.json").read_text())["captions"]) == test


def test_captions_moved_to_other_images_in_the_caption_cache_are_a_warning_and_the_right_numbers(
        cached_run: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Issue 41.2: each test image's captions shifted onto the next image (every structural check passes)
    took `train evaluate` from rsum 444 to 336, with no warning."""
    caches, rows, captions = copy_caches(cached_run, tmp_path)
    monkeypatch.setenv(CACHE_ENV, str(caches))
    resave_keeping_the_digest(captions, shift_captions)
    with np.load(captions) as npz:  # captions other than the dataset's, as arrays that fit together
        arrays = {k: npz[k] for k in npz.files if k not in ("meta", DIGEST)}
    ds = PreparedDataset.load(cached_run["data"])
    assert check_arrays(arrays, text_codec(ds, "chars", 256), len(ds.images)) is None
    capsys.readouterr()
    argv = ["evaluate", "--run", cached_run["run"], "--device", "cpu", "--json", tmp_path / "e.json"]
    assert train(argv) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"caption cache {captions}: its content does not match its "
                                               "digest"), err
    got, want = (json.loads(p.read_text()) for p in (tmp_path / "e.json", cached_run["numbers"]))
    assert got == want
