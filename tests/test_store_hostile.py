"""A feature store received from someone else: its record is checked before any read (issue 30.3).

One table: a corruption of a small store -> `features verify STORE` and a reader (`features export`)
exit 2 with one line naming the file and the field, in a subprocess capped at 1.5 GiB of address space
beyond the interpreter's and 60 s. Each case was a traceback, a hang, gigabytes or a silent wrong
result before the layout check (features.store.layout).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from features.store.core import FeatureStore

ROWS, WIDTH, BLOCK = 116, 16, 32
#: the subprocess's address-space cap: torch/zarr import takes about 1 GiB of virtual memory
MEMORY_CAP = 3 << 30
TIME_CAP = 60


def make_store(path: Path) -> Path:
    """A complete 116 x 16 float32 `global` store, one failed image, blocks of 32 rows."""
    imgids = np.arange(ROWS)
    store = FeatureStore.create(path, imgids, {"global": WIDTH}, BLOCK, config={"kind": "cnn"},
                                provenance={"images_sha256": "0" * 64})
    rng = np.random.default_rng(0)
    for block in range(store.n_blocks):
        start, stop = store.block_rows(block)
        rows = rng.standard_normal((stop - start, WIDTH)).astype(np.float32)
        valid = np.ones(stop - start, bool)
        failures = []
        if block == 1:
            valid[0], rows[0] = False, np.nan
            failures = [{"imgid": start, "reason": "cannot decode"}]
        store.write_block(block, {"global": rows}, valid, failures)
    store.set_attrs(complete=True, failures=[{"imgid": BLOCK, "reason": "cannot decode"}])
    return path


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def set_attr(key: str, value) -> Callable[[Path], None]:
    return lambda s: edit_json(s / "zarr.json", lambda d: d["attributes"].__setitem__(key, value))


def set_meta(array: str, key: str, value) -> Callable[[Path], None]:
    return lambda s: edit_json(s / array / "zarr.json", lambda d: d.__setitem__(key, value))


def gzip_bomb(store: Path) -> None:
    """The first chunk re-encoded with gzip (3 MB that inflates to 3 GB), the array's codec set to gzip."""
    import gzip

    edit_json(store / "global" / "zarr.json", lambda d: d.__setitem__(
        "codecs", [{"name": "bytes", "configuration": {"endian": "little"}},
                   {"name": "gzip", "configuration": {"level": 9}}]))
    with gzip.open(store / "global" / "c" / "0" / "0", "wb", compresslevel=1) as f:
        block = bytes(1 << 24)
        for _ in range(3 * 64):  # 3 GiB of zeros
            f.write(block)


def zstd_frame(total: int, declared: bool) -> bytes:
    """A zstd frame of ``total`` zero bytes in run-length blocks of 128 KiB (4 bytes each: a 2 GiB
    frame is a 64 KiB file), declaring its content size in the header or not."""
    block = 1 << 17
    head = b"\x28\xb5\x2f\xfd" + (bytes([0xC0, 0x38]) + total.to_bytes(8, "little") if declared
                                      else bytes([0x00, 0x38]))
    n = total // block
    blocks = b"".join(((block << 3) | (1 << 1) | (i == n - 1)).to_bytes(3, "little") + b"\x00"
                      for i in range(n))
    return head + blocks


def zstd_bomb(declared: bool) -> Callable[[Path], None]:
    """The first chunk replaced by a zstd frame of 2 GiB of zeros (a 64 KiB file, within the chunk-file
    bound): the array's own codec, so only the decompressor can stop it."""
    def corrupt(store: Path) -> None:
        (store / "global" / "c" / "0" / "0").write_bytes(zstd_frame(2 << 30, declared))
    return corrupt


def fifo_chunk(store: Path) -> None:
    chunk = store / "global" / "c" / "1" / "0"
    chunk.unlink()
    os.mkfifo(chunk)


def zero_chunk(store: Path) -> None:
    chunk = store / "global" / "c" / "2" / "0"
    chunk.unlink()
    chunk.symlink_to("/dev/zero")


def zero_metadata(store: Path) -> None:
    (store / "zarr.json").rename(store / "zarr.json.real")
    (store / "zarr.json").symlink_to("/dev/zero")


def fifo_array_metadata(store: Path) -> None:
    meta = store / "valid" / "zarr.json"
    meta.unlink()
    os.mkfifo(meta)


#: (case, corruption, what the one-line error must name)
CASES = [
    ("dtype float32 -> int32", set_meta("global", "data_type", "int32"), "global/zarr.json: data_type"),
    ("failures with a string imgid", set_attr("failures", [{"imgid": "x"}]), "failures"),
    ("global shape [200, 16] on 116 rows", set_meta("global", "shape", [200, 16]), "global/zarr.json: shape"),
    ("global shape [116, 1e12]", set_meta("global", "shape", [ROWS, 10**12]), "global/zarr.json: shape"),
    ("valid shape [1e10]", set_meta("valid", "shape", [10**10]), "valid/zarr.json: shape"),
    ("valid shape [116, 1e7]", set_meta("valid", "shape", [ROWS, 10**7]), "valid/zarr.json"),
    ("blocks_done shape [1e9]", set_meta("blocks_done", "shape", [10**9]), "blocks_done/zarr.json: shape"),
    ("block_size 0", set_attr("block_size", 0), "block_size"),
    ("block_size 'x'", set_attr("block_size", "x"), "block_size"),
    ("outputs with 1e9 columns", set_attr("outputs", {"global": 10**9}), "outputs.global"),
    ("gzip chunk that inflates to 3 GB", gzip_bomb, "global/zarr.json: codecs"),
    ("a chunk file that is a FIFO", fifo_chunk, "global/c/1/0: a chunk file is not a regular file"),
    ("a chunk file linked to /dev/zero", zero_chunk, "global/c/2/0: a chunk file is not a regular file"),
    ("the store's zarr.json linked to /dev/zero", zero_metadata, "zarr.json: the store's metadata"),
    ("an array's zarr.json that is a FIFO", fifo_array_metadata, "valid/zarr.json: the array metadata"),
    ("imgid shape [1e12]", set_meta("imgid", "shape", [10**12]), "imgid/zarr.json: shape[0]"),
]


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run(*args: str, capped: bool = True) -> subprocess.CompletedProcess:
    """The command in a subprocess, under the address-space cap unless ``capped`` is False (a command that
    loads torch maps more than the cap before it reads anything)."""
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=TIME_CAP,
                          preexec_fn=_limits if capped else None, env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A prepared dataset of 116 images (the readers load it before the store)."""
    out = tmp_path_factory.mktemp("data") / "data"
    done = run("prep", "synthetic", "--num-images", str(ROWS), "--image-size", "32", "--out", str(out), "-q")
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return make_store(tmp_path_factory.mktemp("pristine") / "feats.zarr")


def test_the_pristine_store_reads(pristine: Path) -> None:
    done = run("features", "verify", str(pristine))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("case,corrupt,names", CASES, ids=[c[0] for c in CASES])
def test_a_corrupted_store_record_is_one_line_before_any_read(data: Path, pristine: Path, tmp_path: Path,
                                                              case: str, corrupt: Callable[[Path], None],
                                                              names: str) -> None:
    import shutil

    store = tmp_path / "feats.zarr"
    shutil.copytree(pristine, store, symlinks=True)
    corrupt(store)
    for command in (("features", "verify", str(store)),
                    ("features", "export", "--store", str(store), "--data", str(data), "--format", "hdf5",
                     "--out", str(tmp_path / "out.h5"))):
        done = run(*command)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, (case, command[1], done.returncode, done.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith("features: error: "), (case, done.stderr[-2000:])
        assert names in lines[0], (case, lines[0])


READ = ("from features.store.read import read_matrix\nfrom vsecore.errors import UserError\nimport sys\n"
        "try:\n    read_matrix(sys.argv[1])\nexcept UserError as exc:\n    sys.exit(str(exc))\n")


@pytest.mark.parametrize("declared,reason", [(True, "the zstd frame declares 2147483648 bytes, but the chunk "
                                                    "holds 2048"),
                                             (False, "the zstd frame declares no content size")],
                         ids=["declared", "undeclared"])
def test_a_zstd_chunk_never_inflates_past_its_chunk(pristine: Path, tmp_path: Path, declared: bool,
                                                    reason: str) -> None:
    """A 64 KiB chunk of the array's own codec that inflates to 2 GiB: verify and a training reader say
    which chunk is damaged, under the memory cap (the frame is refused before it is decompressed)."""
    import shutil

    store = tmp_path / "feats.zarr"
    shutil.copytree(pristine, store, symlinks=True)
    zstd_bomb(declared)(store)
    done = run("features", "verify", str(store))
    assert done.returncode == 2 and "1 damaged block(s)" in done.stderr, done.stderr[-2000:]
    done = subprocess.run([sys.executable, "-c", READ, f"{store}:global"], capture_output=True, text=True,
                          timeout=TIME_CAP, preexec_fn=_limits)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-2000:]
    assert f"array 'global' is damaged at rows 0-31 (chunk file global/c/0/0: {reason}" in lines[0], lines[0]


@pytest.mark.parametrize("where", ["data", "images", "run"])
def test_a_store_is_never_written_inside_an_input_or_another_artifact(data: Path, tmp_path: Path,
                                                                      where: str) -> None:
    """issue 30.7: `features cnn --out` inside its own --data, DATA/images or a run directory is refused
    before a model is loaded."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / ".vse-run").write_text("")
    (run_dir / "config.json").write_text("{}")
    out = {"data": data / "f.zarr", "images": data / "images" / "f.zarr", "run": run_dir / "f.zarr"}[where]
    done = run("features", "cnn", "--data", str(data), "--out", str(out), "--cnn", "resnet152", "--weights",
               "none", capped=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert f"--out {out}" in lines[0] and not out.exists()


# -- issue 41.4: a chunk file missing, or a folder in its place, is damage in every reader -------------------
REGION_SHAPE = (8, 1024)  # 32 KiB float32 rows: one inner chunk per row, in one shard file per block

#: a batch reader (what training uses when the features do not fit its memory): every row, read by StoreRows
READ_ROWS = ("from features.store.rows import open_rows\nfrom vsecore.errors import UserError\nimport sys\n"
             "try:\n    rows, _ = open_rows(sys.argv[1])\n"
             "    assert rows.direct == (':regions' in sys.argv[1])  # the shard reader for regions\n"
             "    rows.take(list(range(len(rows))))\nexcept UserError as exc:\n    sys.exit(str(exc))\n")


def make_region_store(path: Path) -> Path:
    """A complete 116-row region store (`regions`, `counts`) in blocks of 32 rows, no failures."""
    store = FeatureStore.create(path, np.arange(ROWS), {"regions": REGION_SHAPE, "counts": ()}, BLOCK,
                                config={"kind": "regions"}, provenance={}, dtypes={"counts": "int32"})
    rng = np.random.default_rng(1)
    for block in range(store.n_blocks):
        start, stop = store.block_rows(block)
        rows = {"regions": rng.standard_normal((stop - start, *REGION_SHAPE)).astype(np.float32),
                "counts": np.full(stop - start, REGION_SHAPE[0], np.int32)}
        store.write_block(block, rows, np.ones(stop - start, bool), [])
    store.set_attrs(complete=True)
    return path


def removed(chunk: str) -> Callable[[Path], None]:
    return lambda store: (store / chunk).unlink()


def folder_in_place(chunk: str) -> Callable[[Path], None]:
    def corrupt(store: Path) -> None:
        (store / chunk).unlink()
        (store / chunk).mkdir()
        (store / chunk / "x").write_bytes(b"\x28\xb5\x2f\xfd")  # not even empty
    return corrupt


#: (case, array, corruption, its chunk file, its block, what the one line says of the file)
CHUNK_CASES = [
    ("a removed shard", "regions", removed("regions/c/1/0/0"), "regions/c/1/0/0", 1, "missing"),
    ("a folder in a shard's place", "regions", folder_in_place("regions/c/1/0/0"), "regions/c/1/0/0", 1,
     "a folder, not a file"),
    ("a removed chunk file", "global", removed("global/c/2/0"), "global/c/2/0", 2, "missing"),
    ("a folder in a chunk's place", "global", folder_in_place("global/c/2/0"), "global/c/2/0", 2,
     "a folder, not a file"),
]


@pytest.fixture(scope="module")
def pristine_regions(tmp_path_factory) -> Path:
    return make_region_store(tmp_path_factory.mktemp("regions") / "regions.zarr")


@pytest.mark.parametrize("case,key,corrupt,chunk,block,problem", CHUNK_CASES, ids=[c[0] for c in CHUNK_CASES])
def test_a_missing_chunk_file_or_a_folder_in_its_place_is_named_by_every_reader(
        pristine: Path, pristine_regions: Path, tmp_path: Path, case: str, key: str,
        corrupt: Callable[[Path], None], chunk: str, block: int, problem: str) -> None:
    """`features verify`, the whole-array reader (read_matrix: the direct chunk reader for `global`, Zarr for
    sharded `regions`) and the batch reader (StoreRows: its direct shard reader for `regions`) each say in
    one line which chunk file of which rows is damaged. Before: the shard reader raised FileNotFoundError
    or IsADirectoryError tracebacks, and Zarr read both as NaN rows ("valid rows ... not finite")."""
    import shutil

    store = tmp_path / "feats.zarr"
    shutil.copytree(pristine_regions if key == "regions" else pristine, store, symlinks=True)
    corrupt(store)
    done = run("features", "verify", str(store))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "1 damaged block(s)" in lines[0], done.stderr[-2000:]
    said = f"{chunk} missing" if problem == "missing" else f"{chunk}: {problem}"
    assert f"  block {block}: {said}" in done.stdout.splitlines(), done.stdout
    for script in (READ, READ_ROWS):
        done = subprocess.run([sys.executable, "-c", script, f"{store}:{key}"], capture_output=True,
                              text=True, timeout=TIME_CAP, preexec_fn=_limits)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, (case, done.stderr[-2000:])
        rows = f"rows {block * BLOCK}-{block * BLOCK + BLOCK - 1}"
        assert f"array '{key}' is damaged at {rows} (chunk file {chunk}: {problem})" in lines[0], lines[0]


def test_training_on_a_store_with_a_folder_in_a_shards_place_is_one_line(data: Path, pristine_regions: Path,
                                                                        tmp_path: Path) -> None:
    """issue 41.4 as it was met: `train clmr` reading its region rows a batch at a time from the store
    (VSE_FEATURE_MEMORY_MB=0: the direct shard reader) printed an IsADirectoryError traceback."""
    import shutil

    store = tmp_path / "regions.zarr"
    shutil.copytree(pristine_regions, store)
    folder_in_place("regions/c/1/0/0")(store)
    train = ["clmr", "--data", str(data), "--features", f"{store}:regions", "--d", "16", "--batch-size", "8",
             "--epochs", "1", "--device", "cpu", "--val-images", "4", "--out", str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-m", "train", *train], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", VSE_FEATURE_MEMORY_MB="0"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("train: error: ") and ("array 'regions' is damaged at rows 32-63 (chunk file "
                                                       "regions/c/1/0/0: a folder, not a file)") in lines[0]
