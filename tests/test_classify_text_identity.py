"""What a classifier is shown at prediction is what it learned from: ``prep textcls`` and ``train predict``
read a text through one function (:func:`prep.textcls.encoder_text`), so the same raw text gets the same
codes; the Zhang files' escapes are decoded and counted; ``predict --file`` answers every line in order."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from prep.cli import main as prep_main
from prep.sources.textcls import FIELD_SEPARATOR, read_zhang_csv, repair_escapes
from prep.textcls import ZHANG_REPAIRS, TextClsDataset, encoder_text
from train.classification.model import LabelledTexts, classifier_codec, predict_logits
from train.classification.run import load_classification_run
from train.cli import main as train_main
from train.models.classifier import classify_settings
from vsecore.lines import printable

#: a title and a description with everything the AG News files hold: a tab, runs of spaces, complete and
#: broken HTML entities, the escaped dollar, a backslash line break, an escaped quote after a break
HOSTILE = ('"1","Fed\t raises  rates \\$1B","Johnson  amp; Johnson doesn #39;t say \\\\""why""; '
           '&lt;JNJ.N&gt; and the social\\network  #151; quot;fine quot;"')
TINY = ["--encoder", "chain", "--p", "0.0625", "--max-chars", "200", "--batch-size", "8", "--dropout", "0.1",
        "--device", "cpu"]


def _rows(n: int) -> list[str]:
    world = ["paris summit", "berlin treaty", "minister vote"]
    sport = ["goal match", "cup final", "coach win"]
    return [f'"{k % 2 + 1}","{(world if k % 2 == 0 else sport)[k % 3]}","news item {k}"' for k in range(n)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, Path]:
    """``(raw test.csv, prepared dataset, run)``: the hostile row is the first test row."""
    root = tmp_path_factory.mktemp("identity")
    raw = root / "raw"
    raw.mkdir()
    (raw / "classes.txt").write_text("World\nSports\n", encoding="utf-8")
    (raw / "train.csv").write_text("".join(r + "\n" for r in _rows(40)), encoding="utf-8")
    (raw / "test.csv").write_text("".join(r + "\n" for r in [HOSTILE, *_rows(6)]), encoding="utf-8")
    data = root / "data"
    assert prep_main(["textcls", "--train", str(raw / "train.csv"), "--test", str(raw / "test.csv"),
                      "--val-fraction", "0.25", "-q", "--out", str(data)]) == 0
    run = root / "run"
    assert train_main(["classify", "--data", str(data), *TINY, "--epochs", "1", "-q", "--out", str(run)]) == 0
    return raw / "test.csv", data, run


def test_the_hostile_text_is_decoded_and_normalised_and_counted(trained: tuple[Path, Path, Path]) -> None:
    _, data, _ = trained
    ds = TextClsDataset.load(data)
    text = ds.texts[ds.rows("test")[0]]
    assert text == (f"Fed raises rates $1B {FIELD_SEPARATOR} Johnson & Johnson doesn't say \"why\"; <JNJ.N> "
                    "and the social network \u2014\"fine\"")
    record = json.loads((data / "prep.json").read_text())
    assert record["text_repairs"] == ZHANG_REPAIRS and record["repaired_texts"] == 1
    assert record["repaired"] == {"backslash_escapes": 3, "broken_html_entities": 5, "html_entities": 2}


@pytest.mark.parametrize("encoder", ["chain", "gru"])
def test_prep_and_predict_give_the_same_codes(trained: tuple[Path, Path, Path], encoder: str) -> None:
    test_csv, data, _ = trained
    raw = read_zhang_csv(test_csv, 2)[0].text  # the row as the file holds it
    assert "\t" in raw and "  " in raw and "#39;" in raw and "\\$" in raw
    ds = TextClsDataset.load(data)
    settings = classify_settings(encoder=encoder, data=str(data), out="unused", max_chars=200)
    codec = classifier_codec(settings, ds)
    k = ds.rows("test")[0]
    trained_codes = codec.encode(ds.texts[k], ds.tokens[k])
    seen, _ = encoder_text(raw, ds.record["text_repairs"])
    [predicted_codes] = codec.encode_texts([seen])
    assert trained_codes.tolist() == predicted_codes.tolist()
    assert "\t" not in seen and "  " not in seen  # never reach a character encoder


def test_train_predict_scores_the_raw_row_as_training_scored_its_text(trained: tuple[Path, Path, Path],
                                                                    capsys) -> None:
    test_csv, _, run_dir = trained
    raw = read_zhang_csv(test_csv, 2)[0].text
    assert train_main(["predict", "--run", str(run_dir), "--text", raw, "--json"]) == 0
    [line] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    run = load_classification_run(run_dir)
    test = run.split_texts("test")
    logits = predict_logits(run.model, LabelledTexts(test.codes[:1], test.labels[:1], test.codec), run.device)
    expected = torch.softmax(logits, dim=1)[0]
    assert [line["probabilities"][n] for n in run.labels] == pytest.approx(expected.tolist(), abs=1e-6)


def test_predict_file_answers_every_line_in_order(trained: tuple[Path, Path, Path], tmp_path: Path,
                                                  capsys) -> None:
    _, _, run_dir = trained
    lines = ["paris summit", "", "goal match", "   \t ", FIELD_SEPARATOR, "cup final\r", "\f"]
    file = tmp_path / "texts.txt"
    file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert train_main(["predict", "--run", str(run_dir), "--file", str(file)]) == 0
    out = capsys.readouterr().out.split("\n")[:-1]
    assert len(out) == len(lines)
    blank = [not x.split("\t")[0] for x in out]
    assert blank == [False, True, False, True, True, False, True]
    assert [x.split("\t", 2)[2] for x in out] == [printable(t.removesuffix("\r")) for t in lines]
    assert train_main(["predict", "--run", str(run_dir), "--file", str(file), "--json"]) == 0
    records = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["label"] is None for r in records] == blank
    assert all(r["probabilities"] is None for r in records if r["label"] is None)
    assert [r["label"] for r in records if r["label"]] == [x.split("\t")[0] for x in out if x.split("\t")[0]]


def test_the_shared_ag_news_rows_keep_no_escape(shared_data: Path) -> None:
    test_csv = shared_data / "ag_news" / "test.csv"
    if not test_csv.is_file():
        pytest.skip(f"{test_csv} not found")
    with open(test_csv, encoding="utf-8", newline="") as fh:
        fields = [f for row in csv.reader(fh) for f in row[1:]]
    texts = [encoder_text(f, ZHANG_REPAIRS)[0] for f in fields]
    joined = "\n".join(texts)
    for leftover in ("#39;", "quot;", "&lt;", "&gt;", "amp;", "\\", "\t", "  "):
        assert leftover not in joined, leftover
    assert sum(repair_escapes(f)[1]["backslash_escapes"] for f in fields) > 600
