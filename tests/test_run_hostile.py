"""A run directory or model folder received from someone else: every number, checkpoint entry and
featurizer tensor is bounded before anything is allocated (issue 30, items 1, 4 and 5).

One table: a corruption of a tiny chain run R or its exported model folder M -> `train query` or
`train evaluate` exit 2 with one line naming the file and the field, in a subprocess under an
address-space cap and a time cap. Each case was a traceback, gigabytes or a silent acceptance before.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import make_prepared, make_store
from safetensors.torch import save_file

#: the subprocess's address-space cap: torch's CUDA build maps about 3 GiB of virtual memory at start
MEMORY_CAP = 6 << 30
TIME_CAP = 90
TINY = ["--p", "0.125", "--d", "32", "--batch-size", "4", "--seed", "3", "--device", "cpu", "--epochs", "1"]


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run(*args: str, capped: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "train", *args], capture_output=True, text=True,
                          timeout=TIME_CAP, preexec_fn=_limits if capped else None,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A prepared dataset, its 16-wide store and a 24-wide one, a one-epoch chain run R, its model folder
    M, and M made a Full-Network Embedding model (a featurizer of mean 0, std 1, thresholds +-0.25)."""
    root = tmp_path_factory.mktemp("hostile-run")
    data = make_prepared(root / "data", n_train=40, n_val=8, n_test=8)
    store = make_store(root / "feats.zarr", data)
    make_store(root / "feats24.zarr", data, dim=24)
    done = run("chain", "--data", str(data), "--features", f"{store}:global", *TINY, "--out", str(root / "R"),
               "-q", capped=False)
    assert done.returncode == 0, done.stderr[-2000:]
    done = run("export-model", "--run", str(root / "R"), "--out", str(root / "M"), "-q", capped=False)
    assert done.returncode == 0, done.stderr[-2000:]
    fne = shutil.copytree(root / "M", root / "FNE")
    write_featurizer(fne, {"fne_mean": torch.zeros(16), "fne_std": torch.ones(16)})
    edit_json(fne / "model.json", lambda d: d["features"].update(
        key="fne", thresholds=[-0.25, 0.25], store={"kind": "fne", "cnn": "resnet152", "weights": "none",
                                                    "crops": 1, "input_size": 64}))
    return {"root": root, "data": data, "R": root / "R", "M": root / "M", "FNE": fne,
            "image": data / "images" / "0000.jpg"}


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def write_featurizer(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    """``featurizer.safetensors`` of ``tensors``, its SHA-256 recorded in model.json (a consistent
    forgery)."""
    save_file(tensors, str(folder / "featurizer.safetensors"))
    digest = hashlib.sha256((folder / "featurizer.safetensors").read_bytes()).hexdigest()
    edit_json(folder / "model.json", lambda d: d["sha256"].__setitem__("featurizer.safetensors", digest))


def settings(key: str, value) -> Callable[[Path], None]:
    """``settings.KEY = value`` in the folder's config.json or model.json."""
    def corrupt(folder: Path) -> None:
        name = "model.json" if (folder / "model.json").exists() else "config.json"
        edit_json(folder / name, lambda d: d["settings"].__setitem__(key, value))
    return corrupt


def top(key: str, value) -> Callable[[Path], None]:
    def corrupt(folder: Path) -> None:
        name = "model.json" if (folder / "model.json").exists() else "config.json"
        edit_json(folder / name, lambda d: d.__setitem__(key, value))
    return corrupt


def long_integer(folder: Path) -> None:
    """A 5000-digit seed (Python's int() refuses more than 4,300 digits: a ValueError in json.loads)."""
    name = "model.json" if (folder / "model.json").exists() else "config.json"
    path = folder / name
    text = path.read_text()
    assert '"seed": 3' in text
    path.write_text(text.replace('"seed": 3', '"seed": ' + "9" * 5000))


def vocabulary(key: str, value) -> Callable[[Path], None]:
    return lambda m: edit_json(m / "model.json", lambda d: d["vocabulary"].__setitem__(key, value))


def seam_vocabulary(m: Path) -> None:
    """A seam model with a 10M-symbol word vocabulary (a 40 MB model.json, inside its size bound)."""
    from train.models.family import train_settings

    def change(d: dict) -> None:
        old = d["settings"]
        d["settings"] = train_settings(family="seam", out=old["out"], data=old["data"],
                                       features=old["features"], d=32).model_dump()
        d.update(family="seam", text_input="words", vocab_size=10_000_000)
        d["vocabulary"].update(kind="words", symbols=["<pad>", "<unk>"] + ["w"] * (10_000_000 - 2),
                               max_len=d["settings"]["max_words"], min_count=1)
    edit_json(m / "model.json", change)


def featurizer(**tensors: torch.Tensor | None) -> Callable[[Path], None]:
    """The FNE folder's featurizer with some tensors replaced (None: left out)."""
    def corrupt(m: Path) -> None:
        stats = {"fne_mean": torch.zeros(16), "fne_std": torch.ones(16)}
        stats.update(tensors)
        write_featurizer(m, {k: v for k, v in stats.items() if v is not None})
    return corrupt


def thresholds(value) -> Callable[[Path], None]:
    return lambda m: edit_json(m / "model.json", lambda d: d["features"].__setitem__("thresholds", value))


def store_setting(key: str, value) -> Callable[[Path], None]:
    return lambda m: edit_json(m / "model.json", lambda d: d["features"]["store"].__setitem__(key, value))


# -- checkpoints --------------------------------------------------------------------------------------
def checkpoint(change: Callable[[dict], None], name: str = "best.pt") -> Callable[[Path], None]:
    """``checkpoints/NAME`` re-saved with ``change`` applied (torch.save: a well-formed file)."""
    def corrupt(run_dir: Path) -> None:
        path = run_dir / "checkpoints" / name
        state = torch.load(path, weights_only=True)
        change(state)
        torch.save(state, path)
    return corrupt


def optimizer_params(value) -> Callable[[dict], None]:
    return lambda s: s["optimizer"]["param_groups"][0].__setitem__("params", value)


_GIB_ZEROS: list[tuple[bytes, int]] = []


def deflated_gib() -> tuple[bytes, int]:
    """1 GiB of zeros as a raw deflate stream (about 4.6 MB) and its CRC-32, computed once."""
    if not _GIB_ZEROS:
        z, crc = zlib.compressobj(1, zlib.DEFLATED, -15), 0
        block, parts = bytes(1 << 24), []
        for _ in range(64):
            parts.append(z.compress(block))
            crc = zlib.crc32(block, crc)
        parts.append(z.flush())
        _GIB_ZEROS.append((b"".join(parts), crc))
    return _GIB_ZEROS[0]


def write_zip(path: Path, entries: list[tuple[str, bytes, bool]]) -> None:
    """A zip archive of ``(name, body, deflated)`` entries: stored ``body``, or when ``deflated``, a raw
    deflate stream of 1 GiB of zeros (written by hand: zipfile would deflate the 1 GiB each time)."""
    gib, gib_crc = deflated_gib()
    local, central = bytearray(), bytearray()
    for name, body, deflated in entries:
        method, data, crc, size = ((8, gib, gib_crc, 1 << 30) if deflated
                                   else (0, body, zlib.crc32(body), len(body)))
        head = struct.pack("<HHHHHIIIHH", 20, 0, method, 0, 0x21, crc, len(data), size, len(name), 0)
        central += struct.pack("<IH", 0x02014B50, 20) + head + struct.pack("<HHHII", 0, 0, 0, 0, len(local))
        central += name.encode()
        local += struct.pack("<I", 0x04034B50) + head + name.encode() + data
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), len(local), 0)
    path.write_bytes(bytes(local + central + end))


def deflate_bomb(run_dir: Path) -> None:
    """best.pt holding six tensors of 1 GiB under an entry the toolkit does not write, each a deflated
    entry of the zip (a ~30 MB file): the pickle's storage sizes patched from 4,321 values to 2^28."""
    path = run_dir / "checkpoints" / "best.pt"
    state = torch.load(path, weights_only=True)
    state["junk"] = [torch.zeros(4321) for _ in range(6)]
    torch.save(state, path)
    import zipfile

    small, huge = b"M" + (4321).to_bytes(2, "little"), b"J" + (1 << 28).to_bytes(4, "little")
    entries = []
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            body = z.read(info.filename)
            if info.filename.endswith("data.pkl"):
                assert body.count(small) == 12  # six storage sizes, six tensor sizes
                body = body.replace(small, huge)
            entries.append((info.filename, body, len(body) == 4321 * 4))
    write_zip(path, entries)


#: (case, folder R|M|FNE, corruption, command (INPUT: the corrupted folder), what the line must name)
QUERY = ("query", "--run", "INPUT", "--text", "a red dog")
IMAGE_QUERY = ("query", "--run", "INPUT", "--image", "IMAGE")
EVALUATE = ("evaluate", "--run", "INPUT", "--out", "OUT")
CASES = [
    ("settings.p inf", "R", settings("p", float("inf")), QUERY, "config.json: settings.p: inf"),
    ("settings.p inf", "M", settings("p", float("inf")), QUERY, "model.json: settings.p: inf"),
    ("settings.d 10**9", "R", settings("d", 10**9), QUERY, "config.json: settings.d"),
    ("settings.d 10**9", "M", settings("d", 10**9), QUERY, "model.json: settings.d"),
    ("settings.d 2*10**8", "M", settings("d", 2 * 10**8), QUERY, "model.json: settings.d"),
    ("settings.p 1e6", "R", settings("p", 1e6), QUERY, "p 1e+06"),
    ("settings.p 1e6", "M", settings("p", 1e6), QUERY, "p 1e+06"),
    ("feature_shape [10**6]*3", "R", top("feature_shape", [10**6] * 3), QUERY, "config.json: the settings, "
     "vocab_size 24 and feature_shape [1000000, 1000000, 1000000] build no model"),
    ("feature_shape [10**6]*3", "M", top("feature_shape", [10**6] * 3), QUERY, "model.json: the settings"),
    ("5000-digit seed", "R", long_integer, QUERY, "config.json: 'seed': an integer of more than 4,300"),
    ("5000-digit seed", "M", long_integer, QUERY, "model.json: 'seed': an integer of more than 4,300"),
    ("fingerprint_stats 'x'", "R", top("fingerprint_stats", "x"), QUERY, "config.json: 'fingerprint_stats'"),
    ("fingerprints of numbers", "R", top("fingerprints", {"dataset_json": 5}), QUERY,
     "config.json: 'fingerprints'"),
    ("vocabulary.max_len 0", "M", vocabulary("max_len", 0), QUERY, "model.json: vocabulary.max_len 0"),
    ("vocabulary.max_len -5", "M", vocabulary("max_len", -5), QUERY, "model.json: vocabulary.max_len -5"),
    ("seam with a 10M-word vocabulary", "M", seam_vocabulary, QUERY,
     "vocab_size 10000000 and feature_shape [16] describe a model of"),
    ("best.pt: six deflated 1 GiB entries", "R", deflate_bomb, EVALUATE,
     "best.pt: holds a compressed entry 'best/data/"),
    ("best.pt: an unknown entry", "R", checkpoint(lambda s: s.__setitem__("junk", torch.zeros(8))), EVALUATE,
     "best.pt: holds an entry 'junk'"),
    ("best.pt: global_step 'abc'", "R", checkpoint(lambda s: s.__setitem__("global_step", "abc")), EVALUATE,
     "best.pt: its 'global_step' entry is not an integer"),
    ("best.pt: position -1000", "R", checkpoint(lambda s: s.__setitem__("position", -1000)), EVALUATE,
     "best.pt: its 'position' entry is -1000"),
    ("best.pt: epoch -1", "R", checkpoint(lambda s: s.__setitem__("epoch", -1)), EVALUATE,
     "best.pt: its 'epoch' entry is -1"),
    ("best.pt: optimizer params 5", "R", checkpoint(optimizer_params(5)), EVALUATE,
     "best.pt: an optimiser parameter group"),
    ("best.pt: a history of 3 epochs at epoch 1", "R", checkpoint(lambda s: s.__setitem__(
        "history", s["history"] * 3)), EVALUATE, "best.pt: its 'history'"),
    ("best.pt: an optimiser moment of 64 MB", "R", checkpoint(
        lambda s: s["optimizer"]["state"][0].__setitem__("exp_avg", torch.zeros(1 << 24))), EVALUATE,
     "bytes of tensors beside its model's"),
    ("fne_mean of shape (10,)", "FNE", featurizer(fne_mean=torch.zeros(10)), QUERY,
     "featurizer.safetensors: fne_mean is not a finite float vector of the feature width [16]"),
    ("no fne_std", "FNE", featurizer(fne_std=None), QUERY, "featurizer.safetensors: fne_std"),
    ("fne_std 0 everywhere", "FNE", featurizer(fne_std=torch.zeros(16)), QUERY,
     "featurizer.safetensors: fne_std is negative somewhere or zero everywhere"),
    ("fne_mean NaN", "FNE", featurizer(fne_mean=torch.full((16,), float("nan"))), QUERY,
     "featurizer.safetensors: fne_mean"),
    ("thresholds [nan, .25]", "FNE", thresholds([float("nan"), 0.25]), QUERY,
     "model.json: features.thresholds"),
    ("thresholds [.5, -.5]", "FNE", thresholds([0.5, -0.5]), QUERY, "model.json: features.thresholds"),
    ("three thresholds", "FNE", thresholds([-0.25, 0, 0.25]), QUERY, "model.json: features.thresholds"),
    ("string thresholds", "FNE", thresholds(["a", "b"]), QUERY, "model.json: features.thresholds"),
    ("store.resize 10**6", "FNE", store_setting("resize", 10**6), IMAGE_QUERY,
     "model.json: features.store: "),
    ("another store's feature width", "M", lambda m: None,
     ("query", "--run", "INPUT", "--data", "DATA", "--features", "STORE24", "--text", "a red dog"),
     "feats24.zarr: rows of shape [24], but the run"),
]


@pytest.mark.parametrize("folder", ["R", "M", "FNE"])
def test_the_pristine_folders_answer_queries(made: dict[str, Path], folder: str) -> None:
    done = run("query", "--run", str(made[folder]), "--text", "a red dog")
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("case,folder,corrupt,command,names", CASES, ids=[f"{c[1]}: {c[0]}" for c in CASES])
def test_a_hostile_run_or_model_is_one_line(made: dict[str, Path], tmp_path: Path, case: str, folder: str,
                                            corrupt: Callable[[Path], None], command: tuple[str, ...],
                                            names: str) -> None:
    target = shutil.copytree(made[folder], tmp_path / folder)
    corrupt(target)
    values = {"INPUT": str(target), "OUT": str(tmp_path / "eval"), "IMAGE": str(made["image"]),
              "DATA": str(made["data"]), "STORE24": str(made["root"] / "feats24.zarr")}
    done = run(*[values.get(a, a) for a in command])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (case, done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("train: error: "), (case, done.stderr[-2000:])
    assert names in lines[0], (case, lines[0])


# -- train compare: what it tabulates, and what it may replace (issue 30.7) ------------------------------
def other_dataset_run(made: dict[str, Path], to: Path) -> Path:
    """R as if trained on another prepared dataset: its config names one, with that dataset's SHA-256."""
    other = made["root"] / "other-data"
    if not other.exists():
        make_prepared(other, n_train=40, n_val=8, n_test=8, seed=1)
    run_dir = shutil.copytree(made["R"], to)
    digest = hashlib.sha256((other / "dataset.json").read_bytes()).hexdigest()
    assert digest != json.loads((run_dir / "config.json").read_text())["fingerprints"]["dataset_json"]

    def change(d: dict) -> None:
        d["settings"]["data"] = str(other)
        d["fingerprints"]["dataset_json"] = digest
    edit_json(run_dir / "config.json", change)
    return run_dir


#: (case, files put in --out first, --runs (R: the run, R2: R of another dataset), what the line names)
COMPARE_CASES = [
    ("the same run twice", {}, ("R", "R"), "is given twice"),
    ("runs of different prepared datasets", {}, ("R", "R2"), "was trained on another prepared dataset than"),
    ("a compare.md of the user's", {"compare.md": "my notes\n"}, ("R",),
     "holds compare.md, which train compare did not write"),
    ("a rsum_vs_parameters.png of the user's", {"rsum_vs_parameters.png": "PNG"}, ("R",),
     "holds rsum_vs_parameters.png, which train compare did not write"),
    ("a compare.json of the user's", {"compare.json": "{}"}, ("R",),
     "holds compare.json, which train compare did not write"),
]


@pytest.mark.parametrize("case,planted,runs,names", COMPARE_CASES, ids=[c[0] for c in COMPARE_CASES])
def test_compare_refuses_what_it_must_not_tabulate_or_replace(made: dict[str, Path], tmp_path: Path,
                                                              case: str, planted: dict[str, str],
                                                              runs: tuple[str, ...], names: str) -> None:
    folders = {"R": shutil.copytree(made["R"], tmp_path / "R")}
    folders["R2"] = other_dataset_run(made, tmp_path / "R2")
    out = tmp_path / "out"
    out.mkdir()
    for name, text in planted.items():
        (out / name).write_text(text)
    done = run("compare", "--runs", *[str(folders[r]) for r in runs], "--out", str(out))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (case, done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("train: error: ") and names in lines[0], (case, lines)
    assert {p.name: p.read_text() for p in out.iterdir()} == planted  # nothing replaced, nothing added


def test_compare_replaces_its_own_outputs_and_the_users_only_with_overwrite(made: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    run_dir = shutil.copytree(made["R"], tmp_path / "R")
    out = tmp_path / "out"
    done = run("compare", "--runs", str(run_dir), "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    done = run("compare", "--runs", str(run_dir), "--out", str(out))  # its own files: replaced as before
    assert done.returncode == 0, done.stderr[-2000:]
    (out / "compare.json").unlink()
    (out / "compare.md").write_text("my notes\n")
    assert run("compare", "--runs", str(run_dir), "--out", str(out)).returncode == 2
    done = run("compare", "--runs", str(run_dir), "--out", str(out), "--overwrite")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "compare.md").read_text() != "my notes\n" and (out / "compare.json").is_file()
