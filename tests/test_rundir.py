"""Run directories (train.run.layout.RunDir): the marker, what --overwrite may replace, the output-path rule
of every train writer, the fingerprint checks of every reader, and one-line errors for hostile input.

Hostile cases are tables: each is exit 2, one line on stderr, and nothing outside the output changed.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
from helpers import make_prepared, make_store

from train.cli import build_parser
from train.run.layout import RunDir, evaluation_name, is_eval_file, length_name, noise_name
from vsecore.errors import run_cli
from vsecore.outputs import RUN_MARKER

TINY = ["--p", "0.125", "--d", "32", "--batch-size", "4", "--seed", "3", "--device", "cpu"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def train(argv: list[str]) -> int:
    """``train ...`` in process, through the console command's error wrapper."""
    def main(a: list[str]) -> int:
        args = build_parser().parse_args(a)
        return int(args.func(args) or 0)

    return run_cli(main, [str(a) for a in argv], "train")


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (lock files aside) with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("rundata")
    prepared = make_prepared(root / "prepared", n_train=40, n_val=8, n_test=8)
    store = make_store(root / "feats.zarr", prepared, invalid=(3,))
    return prepared, f"{store}:global"


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    """A finished one-epoch run (copied by the tests that change it)."""
    prepared, features = data
    run = tmp_path_factory.mktemp("trained") / "run"
    assert train(["chain", "--data", prepared, "--features", features, *TINY, "--epochs", "1",
                  "--out", run]) == 0
    return run


def copy_run(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


# -- the owner of the layout ------------------------------------------------------------------------
def test_a_run_has_its_marker_and_the_layout_of_run_dir(trained: Path) -> None:
    run = RunDir(trained)
    assert run.marker.name == RUN_MARKER and run.marker.is_file()
    assert run.is_run() and run.holds_run() and run.foreign_entries() == []
    assert run.best.is_file() and run.last.is_file() and run.metrics.is_file() and run.test_eval.is_file()
    assert run.checkpoint("best") == run.best and run.log.is_file() and run.curves.is_file()
    assert is_eval_file("test_best_de.json") and is_eval_file("noise_val.png") and not is_eval_file("x.csv")
    # every name the evaluation writes is one --overwrite may replace, and nothing else is
    for split in ("train", "val", "test"):
        names = [noise_name(split), noise_name(split, "png"), length_name(split)]
        names += [evaluation_name(split, c, lang) for c in ("best", "last") for lang in (None, "de", "ja")]
        assert all(is_eval_file(n) for n in names), names
    assert not is_eval_file(evaluation_name("test", "middle")) and not is_eval_file(noise_name("test", "csv"))


def test_runs_written_before_the_marker_are_recognised_only_when_all_theirs(trained: Path,
                                                                            tmp_path: Path) -> None:
    run = copy_run(trained, tmp_path)
    (run / RUN_MARKER).unlink()
    assert RunDir(run).is_run()
    (run / "checkpoints" / ".last.pt.host-1.ab.tmp").write_bytes(b"")  # a killed writer's temporary
    assert RunDir(run).is_run() and RunDir(run).foreign_entries() == []
    (run / "checkpoints" / "mine.pt").write_bytes(b"mine")
    assert not RunDir(run).is_run()
    assert RunDir(run).foreign_entries() == ["checkpoints/mine.pt"]


def test_a_run_from_before_the_marker_resumes_and_is_overwritten(data, trained: Path, tmp_path: Path,
                                                                  capsys) -> None:
    prepared, features = data
    run = copy_run(trained, tmp_path)
    (run / RUN_MARKER).unlink()
    assert train(["chain", "--out", run, "--resume", "--epochs", "2"]) == 0
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2 and (run / RUN_MARKER).is_file()
    (run / RUN_MARKER).unlink()
    assert train(["chain", "--data", prepared, "--features", features, *TINY, "--epochs", "1", "--out", run,
                  "--overwrite"]) == 0
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1


def test_overwrite_replaces_only_what_the_run_wrote(data, trained: Path, tmp_path: Path) -> None:
    prepared, features = data
    run = copy_run(trained, tmp_path)
    (run / "eval" / "test_last.json").write_text("{}")  # an earlier `train evaluate` result: the run's own
    (run / "eval" / "noise_test.png").write_bytes(b"png")
    assert train(["chain", "--data", prepared, "--features", features, *TINY, "--epochs", "1", "--out", run,
                  "--overwrite", "--seed", "4"]) == 0
    assert not (run / "eval" / "test_last.json").exists() and not (run / "eval" / "noise_test.png").exists()
    assert json.loads((run / "config.json").read_text())["settings"]["seed"] == 4


def _hostile_out(tmp_path: Path, trained: Path, data: tuple[Path, str], case: str) -> tuple[Path, list[str]]:
    """The --out of a hostile case, made in ``tmp_path``, and extra options."""
    prepared, features = data
    run = tmp_path / "out"
    if case in ("user checkpoint", "user eval note", "user top file", "no overwrite"):
        shutil.copytree(trained, run)
        extra = {"user checkpoint": ("checkpoints/mine.pt", b"mine"), "no overwrite": None,
                 "user eval note": ("eval/notes.txt", b"n"), "user top file": ("notes.txt", b"n")}[case]
        if extra:
            (run / extra[0]).write_bytes(extra[1])
        return run, ([] if case == "no overwrite" else ["--overwrite"])
    if case == "user metrics":
        run.mkdir()
        (run / "metrics.jsonl").write_text('{"mine": 1}\n')
        return run, ["--overwrite"]
    if case == "repository root":
        run.mkdir()
        for name in ("Makefile", "README.md", "pyproject.toml"):
            (run / name).write_text(name)
        (run / "train").mkdir()
        return run, ["--overwrite"]
    if case == "a file":
        run.write_text("a file")
        return run, ["--overwrite"]
    if case == "prepared dataset":
        shutil.copytree(prepared, run)
        (run / ".vse-prepared").write_text("")
        return run, ["--overwrite"]
    if case == "feature store":
        shutil.copytree(features.rpartition(":")[0], run)
        return run, ["--overwrite"]
    if case == "inside a store":
        store = tmp_path / "s.zarr"
        shutil.copytree(features.rpartition(":")[0], store)
        return store / "run", []
    if case == "the data":
        return prepared, ["--overwrite"]
    if case == "root":
        return Path("/"), ["--overwrite"]
    if case == "missing resume":
        return run, ["--resume"]
    raise AssertionError(case)


@pytest.mark.parametrize("case, expected", [
    ("user checkpoint", "holds a file train did not write: checkpoints/mine.pt"),
    ("user eval note", "holds a file train did not write: eval/notes.txt"),
    ("user top file", "holds a file train did not write: notes.txt"),
    ("user metrics", "not a run directory and holds a file train did not write: metrics.jsonl"),
    ("repository root", "not a run directory and holds a file train did not write: Makefile"),
    ("no overwrite", "already holds a run (checkpoints/last.pt, checkpoints/best.pt, metrics.jsonl, "
                     "config.json); use --resume to continue it or --overwrite"),
    ("a file", "exists and is not a folder"),
    ("prepared dataset", "is a prepared dataset"),
    ("feature store", "is a feature store"),
    ("inside a store", "lies inside the feature store"),
    ("the data", "is an input of this command"),
    ("root", "is the file system root"),
    ("missing resume", "no run at"),
])
def test_train_refuses_an_out_it_would_damage(data, trained: Path, tmp_path: Path, capsys, case: str,
                                              expected: str) -> None:
    prepared, features = data
    out, extra = _hostile_out(tmp_path, trained, data, case)
    before, data_before = snapshot(tmp_path), snapshot(prepared)
    argv = ["chain", "--out", out, *extra] if "--resume" in extra else \
        ["chain", "--data", prepared, "--features", features, *TINY, "--epochs", "1", "--out", out, *extra]
    code = train(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and expected in err, err
    assert snapshot(tmp_path) == before and snapshot(prepared) == data_before


def test_pipeline_overwrite_keeps_what_the_run_did_not_write(tmp_path: Path, trained: Path, capsys) -> None:
    from types import SimpleNamespace

    from pipelines import runner as pipeline
    from train.config.run import read_config, settings_from_config

    run = copy_run(trained, tmp_path)
    (run / "checkpoints" / "mine.pt").write_bytes(b"mine")
    settings = settings_from_config(read_config(run)["settings"]).model_copy(update={"out": str(run)})
    before = snapshot(run)
    code = run_cli(lambda a: pipeline._run_train(SimpleNamespace(train=settings), False, True), [], "train")
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.endswith("holds a file train did not write: checkpoints/mine.pt; move it away "
                                      "or give another --out (--overwrite replaces only a whole run)")
    assert snapshot(run) == before


# -- outputs of the readers -------------------------------------------------------------------------
@pytest.fixture
def npy_pair(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    img, cap = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(img, rng.normal(size=(4, 8)).astype(np.float32))
    np.save(cap, rng.normal(size=(20, 8)).astype(np.float32))
    return img, cap


@pytest.mark.parametrize("argv, expected", [
    (["evaluate", "--run", "{run}", "--ranks", "{run}/checkpoints/best.pt"], "is an input of this command"),
    (["evaluate", "--run", "{run}", "--json", "{run}/config.json"], "is an input of this command"),
    (["evaluate", "--run", "{run}", "--json", "{run}/metrics.jsonl"], "but not in its eval/ folder"),
    (["evaluate", "--run", "{run}", "--gallery", "{run}/eval/test.json"], "exists; add --overwrite"),
    (["evaluate", "--run", "{run}", "--ranks", "{tmp}/old.csv"], "--ranks {tmp}/old.csv: exists; add"),
    (["evaluate", "--run", "{run}", "--ranks", "{data}/ranks.csv"], "is an input of this command"),
    (["evaluate", "--run", "{run}", "--ranks", "{tmp}/x.csv", "--json", "{tmp}/x.csv"], "is also the"),
    (["evaluate", "--run", "{run}", "--out", "{run}/checkpoints"], "is an input of this command"),
    (["evaluate", "--run", "{run}", "--out", "{run}/tensorboard"], "but not in its eval/ folder"),
    (["evaluate", "--img-emb", "{tmp}/a.npy", "--cap-emb", "{tmp}/b.npy", "--measure", "cosine", "--json",
      "{tmp}/a.npy", "--overwrite"], "--json {tmp}/a.npy: is an input of this command"),
    (["evaluate", "--img-emb", "{tmp}/a.npy", "--cap-emb", "{tmp}/b.npy", "--measure", "cosine", "--ranks",
      "{tmp}/old.csv"], "exists; add --overwrite"),
    (["evaluate", "--sims", "{tmp}/a.npy", "--json", "{run}/eval/x.json"], "lies inside the run directory"),
    (["report", "{run}", "--plot", "{run}/config.json", "--overwrite"], "is an input of this command"),
    (["report", "{run}", "--json", "{tmp}/old.csv"], "exists; add --overwrite"),
    (["export-embeddings", "--run", "{run}", "--out", "{tmp}"], "already holds test_img.npy"),
    (["export-embeddings", "--run", "{run}", "--out", "{run}/eval"], "is an input of this command"),
    (["export-embeddings", "--run", "{run}", "--out", "{data}", "--overwrite"], "is an input"),
    (["query", "--run", "{run}", "--text", "a red car", "--json", "{tmp}/old.csv"],
     "exists; add --overwrite"),
    (["query", "--run", "{run}", "--text", "a red car", "--json", "{run}/eval/q.json", "--overwrite"],
     "is an input of this command"),
    (["query", "--run", "{run}", "--text", " "], "an empty query"),
])
def test_outputs_never_replace_inputs_or_what_exists(data, trained: Path, tmp_path: Path, npy_pair, capsys,
                                                     argv: list[str], expected: str) -> None:
    prepared, _ = data
    run = copy_run(trained, tmp_path)
    (tmp_path / "old.csv").write_text("mine")
    (tmp_path / "test_img.npy").write_bytes(b"mine")
    names = {"run": run, "tmp": tmp_path, "data": prepared}
    before, data_before = snapshot(tmp_path), snapshot(prepared)
    code = train([a.format(**names) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and expected.format(**names) in err, err
    assert snapshot(tmp_path) == before and snapshot(prepared) == data_before


def test_a_re_evaluation_replaces_its_own_eval_files_and_overwrite_the_others(trained: Path, tmp_path: Path,
                                                                             capsys) -> None:
    run = copy_run(trained, tmp_path)
    for _ in range(2):
        assert train(["evaluate", "--run", run, "--device", "cpu"]) == 0
    (tmp_path / "old.csv").write_text("mine")
    assert train(["evaluate", "--run", run, "--device", "cpu", "--ranks", tmp_path / "old.csv",
                  "--overwrite"]) == 0
    assert (tmp_path / "old.csv").read_text().startswith("protocol,fold,direction")
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "notes.txt").write_text("mine")
    (tmp_path / "exp" / "test_img.npy").write_text("old")
    assert train(["export-embeddings", "--run", run, "--out", tmp_path / "exp", "--overwrite"]) == 0
    assert (tmp_path / "exp" / "notes.txt").read_text() == "mine"
    assert np.load(tmp_path / "exp" / "test_img.npy").shape[1] == 32


# -- readers check the run's fingerprints -----------------------------------------------------------
@pytest.mark.parametrize("change, expected", [
    ("alphabet", "the run's prepared dataset changed since it was trained: chars.json in"),
    ("dataset", "the run's prepared dataset changed since it was trained: dataset.json in"),
    ("features", "the run's features changed since it was trained: the feature matrix in"),
    ("layout", "the run's features changed since it was trained: its data type, shape, chunking or codecs"),
])
def test_readers_refuse_a_run_whose_inputs_changed(tmp_path: Path, capsys, change: str,
                                                  expected: str) -> None:
    prepared = make_prepared(tmp_path / "prepared", n_train=40, n_val=8, n_test=8)
    store = make_store(tmp_path / "feats.zarr", prepared)
    run = tmp_path / "run"
    assert train(["chain", "--data", prepared, "--features", f"{store}:global", *TINY, "--epochs", "1",
                  "--out", run]) == 0
    if change == "alphabet":  # re-prepared with another alphabet: the same symbols in another order
        chars = json.loads((prepared / "chars.json").read_text())
        chars["symbols"] = chars["symbols"][:2] + chars["symbols"][2:][::-1]
        (prepared / "chars.json").write_text(json.dumps(chars))
    elif change == "dataset":
        text = (prepared / "dataset.json").read_text()
        (prepared / "dataset.json").write_text(text.replace("A red", "A RED", 1))
    elif change == "layout":  # the same bytes declared int32, record and array alike: only the layout says so
        group = json.loads((store / "zarr.json").read_text())
        meta = json.loads((store / "global" / "zarr.json").read_text())
        group["attributes"]["dtypes"]["global"], meta["data_type"], meta["fill_value"] = "int32", "int32", 0
        (store / "zarr.json").write_text(json.dumps(group))
        (store / "global" / "zarr.json").write_text(json.dumps(meta))
    else:  # re-extracted with other weights
        shutil.rmtree(store)
        make_store(store, prepared, seed=1)
    capsys.readouterr()
    for argv in (["evaluate", "--run", run, "--device", "cpu"],
                 ["query", "--run", run, "--text", "a red car", "--device", "cpu"],
                 ["export-embeddings", "--run", run, "--out", tmp_path / "exp", "--device", "cpu"]):
        before = snapshot(run)
        assert train(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err and "--accept-changed-inputs" in err, err
        assert snapshot(run) == before
    assert train(["evaluate", "--run", run, "--device", "cpu", "--accept-changed-inputs"]) == 0
    assert "warning:" in capsys.readouterr().err


def test_a_run_recorded_before_the_store_layout_fingerprint_resumes_and_reads(tmp_path: Path) -> None:
    """Runs trained before ``fingerprints.features_layout`` existed resume and evaluate as before."""
    prepared = make_prepared(tmp_path / "prepared", n_train=40, n_val=8, n_test=8)
    store = make_store(tmp_path / "feats.zarr", prepared)
    run = tmp_path / "run"
    argv = ["chain", "--data", prepared, "--features", f"{store}:global", *TINY, "--out", run]
    assert train([*argv, "--epochs", "1"]) == 0
    config = json.loads((run / "config.json").read_text())
    del config["fingerprints"]["features_layout"]
    (run / "config.json").write_text(json.dumps(config))
    assert train(["evaluate", "--run", run, "--device", "cpu"]) == 0
    assert train([*argv, "--epochs", "2", "--resume"]) == 0
    assert "features_layout" not in json.loads((run / "config.json").read_text())["fingerprints"]


def test_the_fingerprint_check_skips_hashing_unchanged_files(trained: Path, monkeypatch) -> None:
    from train.config import run as runs

    config = runs.read_config(trained)
    data = config["settings"]["data"]
    assert set(config["fingerprint_stats"]) == {"dataset_json", "chars_json"}
    monkeypatch.setattr(runs, "sha256_file", lambda path: pytest.fail(f"hashed {path}"))
    assert runs.changed_dataset_files(config, data) == []


# -- the splits a run needs, before the first step --------------------------------------------------
@pytest.mark.parametrize("invalid, expected", [
    (range(48, 56), "the test split has no image with valid features and a caption in 'en' (8 images, 0 with "
                    "valid features); the run needs one to evaluate after training"),
    (range(40, 48), "split 'val' has no usable en captions (8 images skipped for invalid features)"),
])
def test_an_all_invalid_split_is_refused_before_training(tmp_path: Path, capsys, invalid: range,
                                                         expected: str) -> None:
    prepared = make_prepared(tmp_path / "prepared", n_train=40, n_val=8, n_test=8)
    store = make_store(tmp_path / "feats.zarr", prepared, invalid=tuple(invalid))
    code = train(["chain", "--data", prepared, "--features", f"{store}:global", *TINY, "--epochs", "1",
                  "--out", tmp_path / "run"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert expected in err, err
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "config.json").exists()


# -- hostile numbers and texts ----------------------------------------------------------------------
@pytest.mark.parametrize("argv, expected", [
    (["chain", "--dry-run", "--p", "inf"], "--p inf: must be a finite number"),
    (["chain", "--dry-run", "--lr", "inf"], "--lr inf: must be a finite number"),
    (["chain", "--dry-run", "--seed", "-1"], "--seed -1: must be between 0 and 4294967295"),
    (["chain", "--dry-run", "--seed", str(10**20)], "must be between 0 and 4294967295"),
    (["chain", "--dry-run", "--image-dim", "-1"], "--image-dim -1: must be at least 1"),
    (["liwe", "--dry-run", "--layers", "0,0"], "--layers 0,0: every layer needs at least 1 unit"),
    (["chain", "--out", "{tmp}/missing", "--resume"], "no run at {tmp}/missing to resume"),
])
def test_hostile_numbers_are_one_line_errors(tmp_path: Path, capsys, argv: list[str], expected: str) -> None:
    code = train([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and expected.format(tmp=tmp_path) in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [b"\x80\x81\xff\x00binary", b"[1, 2]", b'{"settings": 3}', b"{"])
def test_a_damaged_config_json_is_one_line(trained: Path, tmp_path: Path, capsys, content: bytes) -> None:
    run = copy_run(trained, tmp_path)
    (run / "config.json").write_bytes(content)
    for argv in (["evaluate", "--run", run], ["report", run], ["chain", "--out", run, "--resume"]):
        assert train(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{run}/config.json" in err, err


def test_query_escapes_control_characters(trained: Path, tmp_path: Path, capsys) -> None:
    from train.retrieval.query import Hit, format_hits

    text = format_hits("a \x1b[31mred\x1b[0m car\r", [Hit(1, 0.5, 7, text="caption\x1b]0;owned\x07\nnext")])
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text and len(text.splitlines()) == 2
    assert "\\x1b[31mred" in text and "caption\\x1b]0;owned\\x07\\nnext" in text
    assert train(["query", "--run", trained, "--text", "a \x1b[2Jred car", "--device", "cpu"]) == 0
    assert "\x1b" not in capsys.readouterr().out


# -- a full disk, SIGTERM ---------------------------------------------------------------------------
def _enospc(path: object) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_a_full_disk_during_training_is_one_line_with_what_was_kept(data, tmp_path: Path, capsys,
                                                                    monkeypatch) -> None:
    from train.engine import trainer

    prepared, features = data
    real, calls = trainer.save_checkpoint, []
    # scripted validation: every epoch improves, so epoch 2 writes best.pt before last.pt on every CPU
    # (with real scores, an epoch 2 that does not improve on some kernels writes only last.pt)
    monkeypatch.setattr(trainer.Trainer, "validate", lambda self: (10.0 * (self.epoch + 1), {}))

    def save(path: Path, state: dict) -> None:
        calls.append(path)
        if len(calls) > 2:  # epoch 1's best and last are written, epoch 2's best fails
            raise _enospc(path)
        real(path, state)

    monkeypatch.setattr(trainer, "save_checkpoint", save)
    run = tmp_path / "run"
    code = train(["chain", "--data", prepared, "--features", features, *TINY, "--epochs", "3",
                  "--checkpoint-every", "1000", "--out", run])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert [p.name for p in calls] == ["best.pt", "last.pt", "best.pt"]
    assert err == (f"train: error: {calls[-1]}: no space left on the device: free space there (or write "
                   "elsewhere) and run again (epoch 1 kept: re-run with --resume)")
    monkeypatch.setattr(trainer, "save_checkpoint", real)
    assert train(["chain", "--out", run, "--resume"]) == 0


def test_a_full_disk_in_evaluate_and_export_is_one_line(trained: Path, tmp_path: Path, capsys,
                                                        monkeypatch) -> None:
    from train.retrieval import embeddings as export
    from train.retrieval.evaluate import entry as evaluation  # where an evaluation's JSON is written

    def full(path: object, *args: object, **kwargs: object) -> None:
        raise _enospc(path)

    monkeypatch.setattr(evaluation, "write_json_atomic", full)
    monkeypatch.setattr(export, "_save", full)
    for argv, where in ((["evaluate", "--run", trained, "--json", tmp_path / "e.json"], tmp_path / "e.json"),
                        (["export-embeddings", "--run", trained, "--out", tmp_path / "x"],
                         tmp_path / "x" / "test_img.npy")):
        assert train([*argv, "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"train: error: {where}: no space left on the device: free space there (or write " \
                      "elsewhere) and run again"


def test_sigterm_while_writing_ranks_leaves_no_temporary(trained: Path, tmp_path: Path, capsys,
                                                         monkeypatch) -> None:
    import csv

    from train.retrieval.evaluate import tables as report

    real = csv.writer

    class Writer:
        def __init__(self, fh: object, **kwargs: object) -> None:
            self.inner, self.rows = real(fh, **kwargs), 0

        def writerow(self, row: list) -> None:
            self.inner.writerow(row)
            self.rows += 1
            if self.rows == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(report.csv, "writer", Writer)
    ranks = tmp_path / "E.csv"
    assert train(["evaluate", "--run", trained, "--device", "cpu", "--json", tmp_path / "e.json",
                  "--ranks", ranks]) == 143
    assert capsys.readouterr().err.strip() == "train: terminated"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.json"]


def test_sigterm_during_training_says_what_was_kept(data, tmp_path: Path, capsys, monkeypatch) -> None:
    from train.engine import trainer

    prepared, features = data
    real = trainer.Trainer.write_metrics

    def write_then_terminate(self: trainer.Trainer) -> None:
        real(self)
        if self.history:  # after epoch 1's checkpoints and metrics, as a batch scheduler would
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(trainer.Trainer, "write_metrics", write_then_terminate)
    run = tmp_path / "run"
    assert train(["chain", "--data", prepared, "--features", features, *TINY, "--epochs", "3",
                  "--out", run]) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "train: terminated (epoch 1 kept: re-run with --resume)"
    assert not [p for p in run.rglob("*.tmp")]
    monkeypatch.setattr(trainer.Trainer, "write_metrics", real)
    assert train(["chain", "--out", run, "--resume"]) == 0
