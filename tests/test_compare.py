"""``train compare``: families side by side on one dataset and store, resumed after a kill, collected.

Tiny runs on the synthetic dataset (48 images): a global store for chain / vse and a region store for
clmr, with pipeline entries that shrink every model (d = 16) so the whole comparison takes seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import make_compare_inputs, metrics_without_timings

from train.cli import main as train_main  # every train command, train pipeline too
from train.engine.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ENTRIES = "tiny-chain,tiny-vse,tiny-clmr"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    return make_compare_inputs(tmp_path_factory.mktemp("compare"))


def compare(inputs: dict[str, str], out: Path, *extra: str) -> int:
    return train_main(["compare", "--data", inputs["data"], "--features", inputs["features"], "--regions",
                       inputs["regions"], "--pipelines", inputs["pipelines"], "--families", ENTRIES,
                       "--epochs", "3", "--noise", "0.1,0.25", "--out", str(out), "--device", "cpu", *extra])


def test_compare_trains_every_entry_and_reports_each_runs_own_numbers(inputs, tmp_path, capsys) -> None:
    out = tmp_path / "cmp"
    assert compare(inputs, out) == 0
    captured = capsys.readouterr()
    printed = captured.out
    # what the comparison's evaluations wrote is named where it is kept, never in a temporary folder
    said = captured.out + captured.err
    assert "vse-compare-" not in said and "/eval/noise_test.json" in said, said[-2000:]
    record = json.loads((out / "compare.json").read_text())
    assert record["kind"] == "vse-compare" and [r["name"] for r in record["summary"]] == ENTRIES.split(",")
    assert [r["family"] for r in record["summary"]] == ["chain", "vse", "clmr"]
    assert (out / "rsum_vs_parameters.png").stat().st_size > 1000
    assert (out / "noise_r1.png").stat().st_size > 1000
    table = (out / "compare.md").read_text().splitlines()
    assert len(table) == 2 + 3 and table[0] in printed
    for row, line in zip(record["runs"], table[2:], strict=True):
        run = Path(row["run"])
        config = json.loads((run / "config.json").read_text())
        # every run read the comparison's dataset and the store of its kind of image input
        assert config["settings"]["data"] == str(Path(inputs["data"]).resolve())
        kind = "regions" if row["family"] == "clmr" else "global"
        assert config["settings"]["features"].endswith(":" + kind)
        assert config["settings"]["epochs"] == 3 and config["settings"]["seed"] == 0
        # the table's numbers are the run's own test evaluation and parameter count
        test = json.loads((run / "eval" / "test.json").read_text())["protocols"]["all"]
        assert row["rsum"] == test["rsum"] and row["i2t_r1"] == test["i2t"]["r1"]
        assert row["parameters"] == config["parameters"]["total"]
        assert f"{test['rsum']:.1f} |" in line and f"{config['parameters']['total']:,}" in line
        history = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert row["epochs"] == len(history) == 3
        assert row["captions_per_s"] == pytest.approx(
            sum(r["captions"] for r in history) / sum(r["train_time_s"] for r in history))
        noise = json.loads((run / "eval" / "noise_test.json").read_text())
        assert [p["ratio"] for p in noise["ratios"]] == [0.1, 0.25]
    summary = record["summary"][0]
    assert summary["noise"]["ratio"] == [0.0, 0.1, 0.25] and summary["seeds"] == 1
    assert summary["rsum_std"] is None

    # re-running the finished comparison trains nothing and prints the same table
    assert compare(inputs, out) == 0
    captured = capsys.readouterr()
    assert captured.out.count("finished, kept") == 3 and "training" not in captured.out
    assert (out / "compare.md").read_text().splitlines() == table

    # --runs collects finished runs, the same numbers
    runs = [r["run"] for r in record["runs"]]
    assert train_main(["compare", "--runs", *runs]) == 0
    collected = capsys.readouterr().out
    assert all(f"{r['rsum']:.1f} |" in collected for r in record["runs"])


def test_a_killed_comparison_resumes_the_run_it_was_in(inputs, tmp_path, monkeypatch, capsys) -> None:
    whole = tmp_path / "whole"
    assert compare(inputs, whole) == 0
    original = Trainer._end_epoch

    def killed_after_epoch_2(self: Trainer) -> None:
        original(self)
        if self.run_dir.name.startswith("tiny-vse") and self.epoch == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_end_epoch", killed_after_epoch_2)
    killed = tmp_path / "killed"
    assert compare(inputs, killed) == 130
    assert not (killed / "runs" / "tiny-clmr-seed0").exists()
    monkeypatch.setattr(Trainer, "_end_epoch", original)
    capsys.readouterr()
    assert compare(inputs, killed) == 0
    err = capsys.readouterr().out
    assert "tiny-chain-seed0: finished, kept" in err
    assert "tiny-vse-seed0: resuming vse (pipeline tiny-vse)" in err and "at the end of epoch 2" in err
    for name in ("tiny-chain-seed0", "tiny-vse-seed0", "tiny-clmr-seed0"):
        runs = killed / "runs" / name, whole / "runs" / name
        assert metrics_without_timings(runs[0]) == metrics_without_timings(runs[1])


def test_seeds_give_mean_and_sample_std(inputs, tmp_path) -> None:
    out = tmp_path / "seeds"
    assert train_main(["compare", "--data", inputs["data"], "--features", inputs["features"], "--pipelines",
                       inputs["pipelines"], "--families", "tiny-chain", "--epochs", "2", "--seeds", "2",
                       "--seed", "5", "--noise", "0.1", "--out", str(out), "--device", "cpu"]) == 0
    record = json.loads((out / "compare.json").read_text())
    a, b = (r["rsum"] for r in record["runs"])
    assert [Path(r["run"]).name for r in record["runs"]] == ["tiny-chain-seed5", "tiny-chain-seed6"]
    summary = record["summary"][0]
    assert summary["seeds"] == 2 and summary["rsum"] == pytest.approx((a + b) / 2)
    assert summary["rsum_std"] == pytest.approx(abs(a - b) / 2 ** 0.5)
    assert " ± " in (out / "compare.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--families", "clmr"], "this family reads region features: give --regions"),
    (["--families", "nonesuch"], "'nonesuch' is neither a family"),
    (["--families", "chain,chain"], "a name is given twice"),
    (["--seeds", "0"], "--seeds 0: must be at least 1"),
])
def test_impossible_comparisons_are_one_line_errors(inputs, tmp_path, capsys, argv, message) -> None:
    assert train_main(["compare", "--data", inputs["data"], "--features", inputs["features"],
                       "--out", str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_compare_never_writes_into_an_input(inputs, capsys) -> None:
    assert train_main(["compare", "--data", inputs["data"], "--features", inputs["features"],
                       "--families", "chain", "--out", inputs["data"]]) == 2
    assert "is an input of this command" in capsys.readouterr().err


def test_the_compare_pipeline_chains_its_stores() -> None:
    from pipelines.schema import load_pipelines

    root = Path(__file__).resolve().parents[1]
    pipe = load_pipelines(root / "pipelines.yaml")["coco-sample-compare"]
    assert pipe.compare.data == pipe.prep.out
    assert pipe.compare.features == f"{pipe.features.out}:global"
    assert pipe.compare.regions == f"{pipe.regions.out}:regions"
    assert pipe.compare.families == ["chain", "oecc", "seam", "vse", "clmr", "liwe"]


def test_a_pipeline_compare_stage_runs_its_entries_from_the_same_file(inputs, tmp_path, capsys) -> None:
    pipelines = Path(inputs["pipelines"]).read_text() + f"""
  tiny-compare:
    description: the comparison stage of a pipeline
    prep: {{dataset: synthetic, out: {inputs['data']}, num_images: 96, image_size: 32, captions_per_image: 2,
           languages: [en]}}
    compare:
      families: [tiny-chain, tiny-clmr]
      epochs: 2
      noise: "0.2"
      device: cpu
      features: {inputs['features']}
      regions: {inputs['regions']}
      out: {tmp_path / 'cmp'}
"""
    file = tmp_path / "pipelines.yaml"
    file.write_text(pipelines)
    assert train_main(["pipeline", "tiny-compare", "--pipelines", str(file)]) == 0
    record = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [r["name"] for r in record["summary"]] == ["tiny-chain", "tiny-clmr"]
    assert "[pipeline tiny-compare] compare: done" in capsys.readouterr().out
    assert train_main(["pipeline", "tiny-compare", "--pipelines", str(file)]) == 0
    assert "compare: up to date" in capsys.readouterr().out
