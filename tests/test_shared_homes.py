"""One home for each shared concern (issue 42.3): the model rebuilt from a checkpoint (shape check before any
tensor is read), the resume comparison, the retrieval evaluation entry, the classification evaluation, "AMP
only on CUDA", the wording of disk errors, the bounded readers of JSON and of ``metrics.jsonl``."""

from __future__ import annotations

import ast
import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CLASSIFY_TINY, copy_run

import train.run.checkpoint as checkpoint_module
from train.cli import main as train_main
from train.run.checkpoint import load_checkpoint, save_checkpoint
from vsecore.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def classify_run(textcls_prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two epochs of the tiny classifier (:data:`helpers.CLASSIFY_TINY`)."""
    run = tmp_path_factory.mktemp("classify") / "run"
    assert train_main(["classify", "--data", str(textcls_prepared), *CLASSIFY_TINY, "--epochs", "2", "-q",
                       "--out", str(run)]) == 0
    return run


def _reshaped_copy(run: Path, to: Path) -> Path:
    """A copy of ``run`` whose best checkpoint holds a 2-D weight of shape (3, 3)."""
    copy = copy_run(run, to)
    path = copy / "checkpoints" / "best.pt"
    state = load_checkpoint(path)
    name = next(k for k in state["model"] if k.endswith("weight") and state["model"][k].dim() == 2)
    state["model"][name] = torch.zeros(3, 3)
    save_checkpoint(path, state)
    return copy


@pytest.mark.parametrize("task", ["classification", "retrieval"])
def test_a_checkpoint_of_another_shape_is_refused_before_a_tensor_is_read(
        task: str, classify_run: Path, tiny_chain_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    from train.classification.run import load_classification_run
    from train.retrieval.open import load_run

    run = _reshaped_copy(classify_run if task == "classification" else tiny_chain_run, tmp_path / "r")
    real, loads = checkpoint_module._torch_load, []

    def recording(path: Path, map_location: object, mmap: bool) -> object:
        loads.append(mmap)
        return real(path, map_location, mmap)

    monkeypatch.setattr(checkpoint_module, "_torch_load", recording)
    with pytest.raises(UserError, match=r"has shape \(3, 3\), the model built from the run's settings"):
        (load_classification_run if task == "classification" else load_run)(run, "best", "cpu")
    assert loads == [True], "the tensors were read before the shapes were checked"


def test_one_resume_comparison_for_both_tasks(classify_run: Path, tiny_chain_run: Path) -> None:
    from train.config.run import check_same_config, read_config

    config = read_config(classify_run)
    check_same_config(classify_run, config)  # the same settings resume
    changed = json.loads(json.dumps(config))
    changed["settings"]["dropout"] = 0.3
    with pytest.raises(UserError, match="cannot resume: settings.dropout was 0.1, now 0.3 "):
        check_same_config(classify_run, changed)
    retrieval = read_config(tiny_chain_run)
    with pytest.raises(UserError, match="cannot resume: not a retrieval run"):
        check_same_config(classify_run, retrieval)
    with pytest.raises(UserError, match="cannot resume: not a classification run"):
        check_same_config(tiny_chain_run, config)


def test_validation_and_every_evaluation_of_a_classifier_measure_alike(classify_run: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    from train.classification.evaluate import evaluate_run
    from train.classification.run import load_classification_run

    records = [json.loads(x) for x in (classify_run / "metrics.jsonl").read_text().splitlines()]
    best = max(records, key=lambda r: (r["val_accuracy"], -r["epoch"]))
    run = load_classification_run(classify_run)
    assert run.epoch == best["epoch"]
    assert run.evaluate("val")["accuracy"] == best["val_accuracy"]  # the validation's own measurement
    # the test evaluation after training is train evaluate --run's
    metrics = evaluate_run(classify_run, json_path=tmp_path / "test.json")
    again = json.loads((tmp_path / "test.json").read_text())
    assert again == json.loads((classify_run / "eval" / "test.json").read_text())
    assert metrics["accuracy"] == again["accuracy"]
    capsys.readouterr()


def test_every_retrieval_evaluation_ranks_through_the_one_entry(tiny_chain_run: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture) -> None:
    import train.retrieval.evaluate.entry as entry
    from train.config.run import read_config, settings_from_config
    from train.engine.settings import TrainSection
    from train.retrieval.evaluate.run import evaluate_run
    from train.retrieval.fit import evaluate_after_training
    from train.retrieval.validation import retrieval_scorer

    calls: list[str] = []
    for name in ("evaluate_protocols", "evaluate_similarities"):
        def counted(*args: object, _real: object = getattr(entry, name), _name: str = name,
                    **kwargs: object) -> object:
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(entry, name, counted)
    settings: TrainSection = settings_from_config(read_config(tiny_chain_run)["settings"])
    rng = np.random.default_rng(0)
    images, captions = torch.from_numpy(rng.normal(size=(8, 4))), torch.from_numpy(rng.normal(size=(40, 4)))
    score, _ = retrieval_scorer(settings)(images.float(), captions.float(), np.repeat(np.arange(8), 5))
    assert calls == ["evaluate_protocols"] and score > 0  # validation
    run = copy_run(tiny_chain_run, tmp_path / "run")
    evaluate_after_training(run, settings, torch.device("cpu"))
    assert calls[1:] == ["evaluate_protocols"]  # the test evaluation after training
    evaluate_run(run, "test", ["all"], device="cpu", out_dir=tmp_path / "eval")
    assert calls[2:] == ["evaluate_protocols"]  # train evaluate --run, train compare, the pipeline
    np.save(tmp_path / "img.npy", images.float().numpy())
    np.save(tmp_path / "cap.npy", captions.float().numpy())
    np.save(tmp_path / "sims.npy", (images @ captions.T).float().numpy())
    assert train_main(["evaluate", "--img-emb", str(tmp_path / "img.npy"), "--cap-emb",
                       str(tmp_path / "cap.npy"), "--measure", "cosine", "--device", "cpu"]) == 0
    assert train_main(["evaluate", "--sims", str(tmp_path / "sims.npy"), "--device", "cpu"]) == 0
    assert calls[3:] == ["evaluate_protocols", "evaluate_similarities"]  # train evaluate of files
    capsys.readouterr()


def test_amp_applies_on_cuda_only() -> None:
    from contextlib import nullcontext

    from vsecore.device import autocast, uses_amp

    assert uses_amp(torch.device("cuda"), True) and uses_amp("cuda:1", True)
    assert not uses_amp(torch.device("cpu"), True) and not uses_amp(torch.device("cuda"), False)
    assert isinstance(autocast(torch.device("cpu"), True), nullcontext)
    if torch.cuda.is_available():
        assert isinstance(autocast(torch.device("cuda"), True), torch.autocast)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_disk_errors_have_one_wording(code: int, tmp_path: Path) -> None:
    from prep.out_checks import _os_error
    from vsecore.errors import disk_error_message, disk_error_reason

    reason = disk_error_reason(OSError(code, os.strerror(code)))
    assert reason and disk_error_message(OSError(code, os.strerror(code), "f")) == f"f: {reason}"
    inside = OSError(code, os.strerror(code), str(tmp_path / "data" / "chars.json"))
    out = tmp_path / "data"
    assert str(_os_error(inside, out)) == f"{out}: cannot write --out ({inside.filename}: {reason})"
    assert disk_error_reason(OSError(errno.ENOENT, "gone")) is None
    assert disk_error_reason(ValueError()) is None


def test_metrics_history_is_read_a_bounded_line_at_a_time(tmp_path: Path) -> None:
    from train.retrieval.report import read_history
    from train.run.layout import RunDir

    run = RunDir(tmp_path)
    run.metrics.write_text('{"epoch": 1, "rsum": 10.5}\n{"epoch": 2, "rsum": 1\n')
    with pytest.raises(UserError, match=r"metrics.jsonl: line 2: line 1, column .*: malformed JSON"):
        read_history(run.metrics)
    run.metrics.write_text('{"epoch": 1, "rsum": 10.5}\n{"epoch": 2, "rsum": 12.0}\n')
    assert [r["epoch"] for r in read_history(run.metrics)] == [1, 2]
    run.last.parent.mkdir()
    run.last.write_bytes(b"")
    assert run.kept("re-run") == "epoch 2 kept: re-run"
    run.metrics.unlink()
    os.mkfifo(run.metrics)  # never opened for reading: a FIFO would block its reader
    with pytest.raises(UserError, match="not a regular file"):
        read_history(run.metrics)
    assert run.kept("re-run") == "a checkpoint of epoch 1 kept: re-run"


def _reads_file_text_into_json(node: ast.AST) -> bool:
    """Whether ``node`` is ``json.load(...)`` or ``json.loads(...)`` of a file's text read in place."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "json"):
        return False
    if node.func.attr == "load":
        return True
    reads = ("read_text", "read_bytes", "read", "open")
    return node.func.attr == "loads" and any(
        isinstance(inner, ast.Call) and getattr(inner.func, "attr", getattr(inner.func, "id", None)) in reads
        for arg in node.args for inner in ast.walk(arg))


def test_json_files_are_read_through_the_one_bounded_reader() -> None:
    """vsecore, prep and train parse a JSON file's text only in vsecore.jsonfile (size, kind, nesting, digits,
    all in one line)."""
    found = []
    for package in ("vsecore", "prep", "train"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "jsonfile.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if _reads_file_text_into_json(node):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found
