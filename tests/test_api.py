"""The Python API (``vse``, ``docs/api.md``): the example of ``docs/api.md`` runs as written (its ``python``
blocks executed in order in an empty folder, so the page cannot drift from the code), and each function
calls the very library function its command calls, with equal settings (the library function replaced by
a recorder, the command and the function given the same values)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import vse
from features.entry import main as features_main
from prep.cli import main as prep_main
from train.cli import main as train_main
from vsecore import console

ROOT = Path(__file__).resolve().parents[1]
API_DOC = ROOT / "docs" / "api.md"
#: the fence of the block that needs the trainer's epoch hook (``run_training(on_epoch=...)``)
HOOK_BLOCK = "python hook"


def code_blocks(path: Path) -> list[tuple[str, str]]:
    """``(fence info, code)`` of every fenced block of ``path`` whose language is python, in order."""
    text = path.read_text(encoding="utf-8")
    return [(info.strip(), code) for info, code in
            re.findall(r"^```(python[^\n]*)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)]


def run_blocks(blocks: list[tuple[str, str]], namespace: dict[str, Any]) -> None:
    for info, code in blocks:
        exec(compile(code, f"{API_DOC.name} ({info})", "exec"), namespace)


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], Path]]:
    """The namespace and folder of ``docs/api.md``'s example, every block but the hook's run in order."""
    folder = tmp_path_factory.mktemp("api_example")
    cwd, threads = Path.cwd(), torch.get_num_threads()
    namespace: dict[str, Any] = {"__name__": "api_example"}
    os.chdir(folder)
    torch.set_num_threads(1)  # the suite's workers share the cores
    try:
        run_blocks([b for b in code_blocks(API_DOC) if b[0] == "python"], namespace)
        yield namespace, folder
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)


def test_the_page_has_the_example() -> None:
    infos = [info for info, _ in code_blocks(API_DOC)]
    assert infos.count("python") >= 6 and infos.count(HOOK_BLOCK) == 1, infos
    assert set(infos) == {"python", HOOK_BLOCK}, "a block of another kind would never run"


def test_api_example_runs(example: tuple[dict[str, Any], Path]) -> None:
    ns, folder = example
    data, store, run = ns["data"], ns["store"], ns["run"]
    assert data == folder / "work" / "data" and (data / "dataset.json").is_file()
    assert Path(store) == Path("work/feats.zarr") and (folder / store).is_dir()
    assert run == folder / "runs" / "chain" and (run / "checkpoints" / "best.pt").is_file()
    saved = json.loads((run / "eval" / "test_best.json").read_text())
    assert ns["results"]["all"].metrics.to_dict() == saved["all"]  # what was printed is what was written
    assert [len(found) for found in ns["hits"]] == [3, 3]
    assert [hit.rank for hit in ns["hits"][0]] == [1, 2, 3] and ns["best"].path.endswith(".png")
    assert len(ns["captions"]) == 2 and all(hit.text for hit in ns["captions"])
    assert ns["model"].epoch in (1, 2)  # the best of the two epochs
    assert tuple(ns["texts"].shape) == (2, 16) and tuple(ns["images"].shape) == (1, 16)
    assert ns["message"].startswith("--epochs 0: ") and not (folder / "runs" / "other").exists()


def test_on_epoch_gets_each_metrics_line(example: tuple[dict[str, Any], Path]) -> None:
    ns, folder = example
    hook = [b for b in code_blocks(API_DOC) if b[0] == HOOK_BLOCK]
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        run_blocks(hook, ns)
    finally:
        os.chdir(cwd)
    lines = (folder / "runs" / "watched" / "metrics.jsonl").read_text().splitlines()
    assert [record["epoch"] for record in ns["seen"]] == [1, 2]
    assert ns["seen"] == [json.loads(line) for line in lines]


# -- the same library function as the command, with equal settings -------------------------------------------


def record(monkeypatch: pytest.MonkeyPatch, target: str, returns: Any, *also: str) -> list[dict[str, Any]]:
    """Replace the function ``target`` (``module.name``), and the same function where ``also`` names it (a
    module that imported it), by a recorder of each call's arguments, defaults included; returns the
    list of calls."""
    module, name = target.rsplit(".", 1)
    original = getattr(importlib.import_module(module), name)
    signature = inspect.signature(original)
    calls: list[dict[str, Any]] = []

    def recorder(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append(dict(bound.arguments))
        return returns

    places = [where.rsplit(".", 1) for where in (target, *also)]
    for module, name in places:  # every module imported before one is patched: it would import the recorder
        assert getattr(importlib.import_module(module), name) is original, f"{module}.{name} differs"
    for module, name in places:
        monkeypatch.setattr(importlib.import_module(module), name, recorder)
    return calls


def same_call(calls: list[dict[str, Any]], command: Callable[[], int], api: Callable[[], Any]) -> None:
    """``command()`` (status 0) and ``api()`` each call the recorded function once, with equal arguments."""
    assert command() == 0
    api()
    assert len(calls) == 2, calls
    assert calls[0] == calls[1]


def test_prep_calls_run_prep(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths mean the working directory, in both
    calls = record(monkeypatch, "prep.run.run_prep", tmp_path, "prep.cli.run_prep")
    argv = ["synthetic", "--out", "work/data", "--num-images", "48", "--languages", "en", "de", "--seed", "2",
            "--overwrite"]
    same_call(calls, lambda: prep_main(argv),
              lambda: vse.prep("synthetic", "work/data", num_images=48, languages=("en", "de"), seed=2,
                               overwrite=True))
    assert calls[0]["settings"].out == str(tmp_path / "work" / "data")


@pytest.mark.parametrize(("argv", "kind", "settings"), [
    (["--cnn", "efficientnet_lite0", "--crops", "1", "--batch-size", "8"], "cnn",
     {"cnn": "efficientnet_lite0", "crops": 1, "batch_size": 8}),
    # --max-boxes without --boxes asks for an adaptive count: the command's rule, applied by both
    (["--detector", "fasterrcnn", "--max-boxes", "50"], "regions",
     {"detector": "fasterrcnn", "max_boxes": 50}),
])
def test_extract_calls_run_features(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str],
                                    kind: str, settings: dict[str, Any]) -> None:
    calls = record(monkeypatch, "features.run.run_features", tmp_path, "features.cli.extraction.run_features")
    data, out = str(tmp_path / "data"), str(tmp_path / "s.zarr")
    same_call(calls, lambda: features_main([kind, "--data", data, "--out", out, *argv, "--no-progress"]),
              lambda: vse.extract(kind, data, out, progress=False, **settings))
    if kind == "regions":
        assert calls[0]["settings"].fixed_boxes is None


def test_train_calls_run_training(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = record(monkeypatch, "train.retrieval.fit.run_training", tmp_path)
    data, features, out = str(tmp_path / "data"), f"{tmp_path / 's.zarr'}:global", str(tmp_path / "run")
    argv = ["chain", "--data", data, "--features", features, "--out", out, "--p", "0.125", "--d", "16",
            "--epochs", "2", "--device", "cpu", "--overwrite"]
    same_call(calls, lambda: train_main(argv),
              lambda: vse.train("chain", data, features, out, p=0.125, d=16, epochs=2, device="cpu",
                                overwrite=True))
    assert calls[0]["settings"].p == 0.125 and calls[0]["overwrite"] is True


def test_train_pipeline_settings_as_the_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``pipeline=`` reads the section ``--pipeline`` reads; the arguments given override it."""
    calls = record(monkeypatch, "train.retrieval.fit.run_training", tmp_path)
    argv = ["chain", "--pipeline", "demo", "--pipelines", str(ROOT / "pipelines.yaml"), "--epochs", "1"]
    same_call(calls, lambda: train_main(argv),
              lambda: vse.train("chain", pipeline="demo", pipelines=ROOT / "pipelines.yaml", epochs=1))
    assert calls[0]["settings"].epochs == 1 and calls[0]["settings"].d == 512


def test_evaluate_calls_evaluate_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = record(monkeypatch, "train.retrieval.evaluate.run.evaluate_run", {})
    run = tmp_path / "run"
    argv = ["evaluate", "--run", str(run), "--protocol", "all,1k", "--split", "val", "--noise", "0.1:0.2:0.1",
            "--chance"]
    same_call(calls, lambda: train_main(argv),
              lambda: vse.evaluate(str(run), "val", "all,1k", noise="0.1:0.2:0.1", chance=True))


@pytest.mark.parametrize("other", [False, True])
def test_query_calls_search(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, other: bool) -> None:
    loaded = types.SimpleNamespace()
    opened = record(monkeypatch, "train.retrieval.open.load_run", loaded)
    calls = record(monkeypatch, "train.retrieval.query.search", [[]])
    run = tmp_path / "run"
    collection = {"data": str(tmp_path / "d"), "features": "s.zarr"} if other else {}
    argv = ["query", "--run", str(run), "--text", "a red circle", "--top", "3"]
    argv += [item for key, value in collection.items() for item in (f"--{key}", value)]
    same_call(calls, lambda: train_main(argv),
              lambda: vse.query(str(run), text=["a red circle"], top=3, **collection))
    assert opened[0] == opened[1] and calls[0]["run"] is loaded
    assert calls[0]["split"] == (None if other else "test")


def test_an_unknown_setting_is_an_error_not_ignored(tmp_path: Path) -> None:
    with pytest.raises(vse.UserError, match="unknown setting num_imagez"):
        vse.prep("synthetic", tmp_path / "data", num_imagez=8)
    with pytest.raises(vse.UserError, match="unknown setting fixed_boxes"):  # another kind's extractor's
        vse.extract("cnn", tmp_path / "data", tmp_path / "s.zarr", fixed_boxes=36)
    assert not any(tmp_path.iterdir())


def test_quiet_is_for_one_call(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    levels: list[int] = []
    monkeypatch.setattr(importlib.import_module("prep.run"), "run_prep",
                        lambda settings, overwrite=False: levels.append(console.verbosity()))
    before = console.verbosity()
    vse.prep("synthetic", tmp_path / "data", quiet=True)
    vse.prep("synthetic", tmp_path / "data")
    assert levels == [console.QUIET, before] and console.verbosity() == before
