"""The evaluator's report (JSON, tables, ranks CSV) and `train evaluate` on embedding and similarity files."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from ranking_reference import (
    correlated,
    full_similarity,
    naive_protocol,
    naive_ranks_of,
    naive_topk,
    random_embeddings,
    tie_data,
)

from train.cli import main as train_main
from train.retrieval.evaluate import (
    chance_metrics,
    evaluate_protocols,
    vsepp_caption_image,
)
from train.retrieval.evaluate.tables import format_results, results_json

# --------------------------------------------------------------------------- report and CLI


def test_json_shape_and_table() -> None:
    ci = vsepp_caption_image(24)
    im, _ = random_embeddings(24, 120, 8, "cosine", seed=9)
    cap = correlated(im, ci, 10, "cosine")
    results = evaluate_protocols(im, cap, ci, "cosine", ["1k", "all"], fold_size=12, device="cpu")
    data = results_json(results)
    assert list(data) == ["1k", "all"]
    for entry in data.values():
        assert set(entry) == {"i2t", "t2i", "rsum"}
        assert set(entry["i2t"]) == set(entry["t2i"]) == {"r1", "r5", "r10", "medr", "meanr", "ties"}
    table = format_results(results, {"1k": chance_metrics(ci[:60], 12)})
    assert "COCO-1k" in table and "chance (1k)" in table and "all (24 img)" in table
    assert f"{results['1k'].metrics.rsum:.1f}" in table


def test_cli_on_vsepp_files(tmp_path, capsys) -> None:
    ci = vsepp_caption_image(30)
    im, _ = random_embeddings(30, 150, 8, "order", seed=11)
    cap = correlated(im, ci, 12, "order")
    np.save(tmp_path / "img.npy", np.repeat(im, 5, axis=0))  # VSE++ saves each image five times
    np.save(tmp_path / "cap.npy", cap)
    out = tmp_path / "res.json"
    files = ["--img-emb", str(tmp_path / "img.npy"), "--cap-emb", str(tmp_path / "cap.npy")]
    code = train_main(["evaluate", *files, "--measure", "order", "--protocol", "1k,5cv", "--protocol", "all",
                       "--fold-size", "6", "--json", str(out), "--device", "cpu"])
    printed = capsys.readouterr().out
    assert code == 0 and "taking every 5th row" in printed and "COCO-5cv" in printed
    data = json.loads(out.read_text())
    want = naive_protocol(im, cap, ci, "order", "5cv", fold_size=6)
    assert data["5cv"]["t2i"]["meanr"] == pytest.approx(want["t2i"]["meanr"])
    want_all = naive_protocol(im, cap, ci, "order", "all", 6)
    assert data["all"]["i2t"]["r1"] == pytest.approx(want_all["i2t"]["r1"])

    np.save(tmp_path / "short.npy", im[:29])
    code = train_main(["evaluate", "--img-emb", str(tmp_path / "short.npy"), "--cap-emb",
                       str(tmp_path / "cap.npy"), "--measure", "order"])
    assert code == 2 and "29 images x 5 captions per image != 150" in capsys.readouterr().err


def read_ranks(path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_cli_ranks_csv_with_topk_on_embeddings_and_sims(tmp_path, capsys) -> None:
    im, cap, ci = tie_data(12, n=30, shuffle=False, unit=True)
    ci_k = vsepp_caption_image(30, 3)  # the CLI's layout: k captions per image
    cap = cap[:90]
    cap[3] = im[1]
    np.save(tmp_path / "img.npy", im)
    np.save(tmp_path / "cap.npy", cap)
    s = full_similarity(im, cap, "cosine")
    np.save(tmp_path / "sims.npy", s)
    np.save(tmp_path / "sims_t.npy", np.ascontiguousarray(s.T))
    common = ["--captions-per-image", "3", "--protocol", "5cv,all", "--fold-size", "6", "--topk", "4",
              "--device", "cpu", "--block-images", "4", "--block-captions", "5"]
    runs = {"emb": ["--img-emb", str(tmp_path / "img.npy"), "--cap-emb", str(tmp_path / "cap.npy"),
                    "--measure", "cosine"],
            "sims": ["--sims", str(tmp_path / "sims.npy")],
            "sims_t": ["--sims", str(tmp_path / "sims_t.npy"), "--sims-transposed"]}
    tables = {}
    for name, source in runs.items():
        path = tmp_path / f"{name}.csv"
        assert train_main(["evaluate", *source, *common, "--ranks", str(path)]) == 0
        out = capsys.readouterr().out
        assert f"wrote {5 * (6 + 18) + 30 + 90} query rows" in out
        tables[name] = read_ranks(path)
    assert tables["emb"] == tables["sims"] == tables["sims_t"]
    rows = tables["emb"]
    assert list(rows[0]) == ["protocol", "fold", "direction", "query", "rank", "ties", "ground_truth", "topk",
                             "topk_scores"]
    i2t, t2i = naive_ranks_of(s, ci_k)
    i2t_opt, _ = naive_ranks_of(s, ci_k, gt_last=False)
    top_captions, top_scores = naive_topk(s, 4)
    top_images, _ = naive_topk(s.T, 4)
    everything = [r for r in rows if r["protocol"] == "all"]
    for r in everything:
        q = int(r["query"])
        if r["direction"] == "i2t":
            assert int(r["rank"]) == i2t[q] and int(r["ties"]) == i2t[q] - i2t_opt[q]
            assert r["ground_truth"] == f"{3 * q} {3 * q + 1} {3 * q + 2}"
            assert [int(x) for x in r["topk"].split()] == top_captions[q].tolist()
            assert [np.float32(x) for x in r["topk_scores"].split()] == top_scores[q].tolist()
        else:
            assert int(r["rank"]) == t2i[q] and r["ground_truth"] == str(q // 3)
            assert [int(x) for x in r["topk"].split()] == top_images[q].tolist()
    assert len(everything) == 120 and sum(int(r["ties"]) > 0 for r in everything) > 3
    # a 5cv fold: its own candidates only, indices still rows of the inputs
    fold = [r for r in rows if r["protocol"] == "5cv" and r["fold"] == "2"]
    fold_i2t, _ = naive_ranks_of(s[12:18, 36:54], ci_k[36:54] - 12)
    assert [int(r["query"]) for r in fold if r["direction"] == "i2t"] == list(range(12, 18))
    assert [int(r["rank"]) for r in fold if r["direction"] == "i2t"] == fold_i2t.tolist()
    assert all(36 <= int(x) < 54 for r in fold if r["direction"] == "i2t" for x in r["topk"].split())

    code = train_main(["evaluate", "--sims", str(tmp_path / "sims_t.npy"), "--captions-per-image", "3"])
    assert code == 2 and "transposed; give --sims-transposed" in capsys.readouterr().err
    code = train_main(["evaluate", *runs["sims"], "--captions-per-image", "3", "--measure", "cosine"])
    assert code == 2 and "drop --measure" in capsys.readouterr().err
    code = train_main(["evaluate", *runs["sims"], "--captions-per-image", "3", "--topk", "5"])
    assert code == 2 and "give one of them" in capsys.readouterr().err
    code = train_main(["evaluate", *runs["sims"], "--captions-per-image", "3", "--protocol", "5k"])
    assert code == 2 and "5000 images, the similarity matrix has 30" in capsys.readouterr().err
    code = train_main(["evaluate", *runs["sims"], *runs["emb"]])
    assert code == 2 and "not --img-emb/--cap-emb and --sims" in capsys.readouterr().err


def test_cli_prints_the_warnings_under_the_table(tmp_path, capsys) -> None:
    im, cap = random_embeddings(20, 100, 8, "cosine", seed=26)
    np.save(tmp_path / "img.npy", im)
    np.save(tmp_path / "const.npy", np.repeat(cap[:1], 100, axis=0))  # a collapsed caption encoder
    code = train_main(["evaluate", "--img-emb", str(tmp_path / "img.npy"), "--cap-emb",
                       str(tmp_path / "const.npy"), "--measure", "cosine", "--device", "cpu", "--json",
                       str(tmp_path / "r.json")])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    table = next(k for k, line in enumerate(lines) if line.startswith("all (20 img)"))
    warnings = [k for k, line in enumerate(lines) if line.startswith("warning:")]
    assert len(warnings) == 2 and table < min(warnings) and max(warnings) < len(lines) - 1
    assert "i2t 20 of 20 queries (100.0%, all)" in lines[warnings[1]]
    assert lines[-1].startswith("evaluated 20 images x 100 captions")
    data = json.loads((tmp_path / "r.json").read_text())["all"]
    assert data["i2t"]["r1"] == 0.0 and data["i2t"]["meanr"] == 96 and data["i2t"]["ties"] == 20


def test_trainer_validation_warns_once_per_evaluation(capsys) -> None:
    """The trainer's validation (COCO-5cv here: five folds) prints the tie warning once, on stderr, and once
    per run: a later epoch's validation is silent about ties (issue 43.6), its metrics still count them."""
    from types import SimpleNamespace

    from train.retrieval.validation import retrieval_scorer

    rng = np.random.default_rng(27)
    im = rng.integers(0, 4, size=(5000, 4)).astype(np.float32) / 4  # few distinct rows: ties everywhere
    cap = rng.integers(0, 4, size=(25000, 4)).astype(np.float32) / 4
    settings = SimpleNamespace(measure="cosine", order_sqrt=False, val_protocol="5cv")
    score = retrieval_scorer(settings, device=torch.device("cpu"))
    for _ in range(2):  # two validations (epochs): one line in all
        _, metrics = score(torch.from_numpy(im), torch.from_numpy(cap), vsepp_caption_image(5000))
        assert metrics["5cv"]["t2i"]["ties"] > 4000
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1
    assert all("tied by another candidate" in line and "COCO-5cv" in line for line in lines)
