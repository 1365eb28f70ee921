"""Text classification: ``prep textcls`` (CSV dialect, splits, vocabularies, --out rules), ``train
classify`` (run directory, exact resume), its metrics against hand computation, ``train predict`` and
``train evaluate``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CLASSIFY_TINY, prepare_tiny_textcls, tiny_zhang_rows, write_zhang

from prep.cli import main as prep_main
from prep.sources.textcls import read_generic, read_zhang_csv
from prep.textcls import TextClsDataset, stratified_take
from train.classification.metrics import classification_metrics, confusion_matrix
from train.cli import main as train_main
from vsecore.errors import UserError

#: a tiny classifier (helpers.CLASSIFY_TINY)
TINY = CLASSIFY_TINY


def test_zhang_dialect_quotes_escaped_newlines_and_one_based_labels(tmp_path: Path) -> None:
    path = write_zhang(tmp_path, [
        '"1","Title ""quoted""","first line\\nsecond line"',
        '"2","Multi',
        'line title","plain, with a comma"',
        '"1","","only a description"',
    ])
    rows = read_zhang_csv(path, 2)
    assert [r.label for r in rows] == [0, 1, 0]
    # the fields as the file holds them, joined by the separator (the escapes are decoded by encoder_text)
    assert rows[0].text == 'Title "quoted" \u00b6 first line\\nsecond line'
    assert rows[1].text == "Multi\nline title \u00b6 plain, with a comma"
    assert rows[2].text == " \u00b6 only a description"
    assert [r.where for r in rows] == ["train.csv:1", "train.csv:2", "train.csv:4"]


@pytest.mark.parametrize("bad, message", [
    ('"3","x","y"', "line 3: class index 3 is outside 1..2"),
    ('"0","x","y"', "line 3: class index 0 is outside 1..2"),
    ('"World","x","y"', "line 3: class index 'World' is not an integer"),
    ('"1","only two fields"', "line 3: 2 fields, but the first row has 3"),
])
def test_a_bad_row_is_a_one_line_error_naming_the_line(tmp_path: Path, capsys, bad: str,
                                                        message: str) -> None:
    path = write_zhang(tmp_path / "raw", ['"1","a","b"', '"2","c","d"', bad, '"1","e","f"'])
    with pytest.raises(UserError, match=message):
        read_zhang_csv(path, 2)
    code = prep_main(["textcls", "--train", str(path), "--test-fraction", "0.25", "--out",
                      str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("prep: error: ") and f"{path}: {message}" in err
    assert not (tmp_path / "o").exists()


def test_generic_csv_with_label_names_and_a_language_column(tmp_path: Path) -> None:
    path = tmp_path / "tweets.tsv"
    path.write_text("id\tsentiment\ttext\tlanguage\n1\tpositive\tgood day\tEN\n"
                    "2\tnegative\tschlechter Tag\tde\n", encoding="utf-8")
    rows = read_generic(path, "\t", "sentiment", ["text"], "language")
    assert [(r.text, r.label, r.lang) for r in rows] == [("good day", "positive", "en"),
                                                         ("schlechter Tag", "negative", "de")]
    with pytest.raises(UserError, match="--label-col 'label' is not a column"):
        read_generic(path, "\t", "label", ["text"])


def test_prep_generic_csv_keeps_each_rows_language(tmp_path: Path) -> None:
    path = tmp_path / "tweets.csv"
    rows = ["label,text,lang"] + [f"pos,good happy day {k},en" for k in range(6)] + \
        [f"neg,ein schlechter Tag {k},de" for k in range(6)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "data"
    assert prep_main(["textcls", "--format", "csv", "--train", str(path), "--label-col", "label",
                      "--text-cols", "text", "--lang-col", "lang", "--test-fraction", "0.34",
                      "--val-fraction", "0.25", "-q", "--out", str(out)]) == 0
    ds = TextClsDataset.load(out)
    assert ds.labels == ["neg", "pos"] and ds.languages == ["de", "en"]
    assert [len(ds.rows(s)) for s in ("train", "val", "test")] == [6, 2, 4]
    pairs = zip(ds.langs, ds.targets, strict=True)
    assert all((lang == "de") == (ds.labels[y] == "neg") for lang, y in pairs)
    k = ds.langs.index("de")
    assert ds.tokens[k][:3] == ["ein", "schlechter", "tag"]


def test_a_language_without_a_tokenizer_is_a_one_line_error_naming_its_first_row(tmp_path: Path,
                                                                                   capsys) -> None:
    path = tmp_path / "t.csv"
    path.write_text("label,text,lang\na,one,en\nb,two,en\na,drei,zz\nb,four,en\n", encoding="utf-8")
    assert prep_main(["textcls", "--format", "csv", "--train", str(path), "--label-col", "label",
                      "--text-cols", "text", "--lang-col", "lang", "--test-fraction", "0.25", "--out",
                      str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "t.csv:4: language 'zz' (1 rows)" in err


def test_stratified_take_is_exact_per_class_and_seeded() -> None:
    labels = np.repeat([0, 1, 2, 3], [1900, 1900, 1900, 1900])
    mask = stratified_take(labels, 1500 / 7600, np.random.default_rng(0))
    assert mask.sum() == 1500
    assert [int(mask[labels == c].sum()) for c in range(4)] == [375] * 4
    again = stratified_take(labels, 1500 / 7600, np.random.default_rng(0))
    other = stratified_take(labels, 1500 / 7600, np.random.default_rng(1))
    assert (mask == again).all() and (mask != other).any()
    # remainders go to the classes with the largest fractional parts: 0.5 * (3, 3, 2) -> 1.5, 1.5, 1
    uneven = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    taken = stratified_take(uneven, 0.5, np.random.default_rng(0))
    assert taken.sum() == 4 and [int(taken[uneven == c].sum()) for c in range(3)] == [2, 1, 1]


def test_official_test_kept_val_carved_from_train_and_vocabularies_from_train_only(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    write_zhang(raw, tiny_zhang_rows(40), "train.csv")
    write_zhang(raw, ['"1","Zürich qqq","unseenword"', '"2","x","y"'], "test.csv")
    out = tmp_path / "data"
    assert prep_main(["textcls", "--train", str(raw / "train.csv"), "--test", str(raw / "test.csv"),
                      "--val-fraction", "0.25", "--seed", "3", "--out", str(out)]) == 0
    ds = TextClsDataset.load(out)
    assert ds.labels == ["World", "Sports"] and ds.name == "raw"
    assert [len(ds.rows(s)) for s in ("train", "val", "test")] == [30, 10, 2]
    assert sorted(np.bincount(ds.targets[ds.rows("val")]).tolist()) == [5, 5]
    assert [ds.texts[k] for k in ds.rows("test")] == ["Zürich qqq \u00b6 unseenword", "x \u00b6 y"]
    assert "ü" not in ds.chars and "q" not in ds.chars and "a" in ds.chars
    assert "unseenword" not in ds.words and "paris" in ds.words
    record = json.loads((out / "prep.json").read_text())
    assert record["task"] == "textcls" and len(record["inputs"]) == 3 and all(len(i["sha256"]) == 64
                                                                              for i in record["inputs"])
    assert (out / ".vse-prepared").is_file()
    # --out rules: a prepared dataset is replaced only with --overwrite; the seed changes the val split
    args = ["textcls", "--train", str(raw / "train.csv"), "--test", str(raw / "test.csv"), "--val-fraction",
            "0.25", "--out", str(out)]
    assert prep_main(args) == 2
    assert prep_main([*args, "--overwrite", "--seed", "4"]) == 0
    assert (TextClsDataset.load(out).splits != ds.splits).any()


def test_shared_ag_news_sample_splits_5600_500_1500(shared_data: Path, tmp_path: Path) -> None:
    test_csv = shared_data / "ag_news" / "test.csv"
    if not test_csv.is_file():
        pytest.skip(f"{test_csv} not found")
    out = tmp_path / "ag"
    assert prep_main(["textcls", "--train", str(test_csv), "--test-fraction", "0.1973684", "--val-fraction",
                      "0.0819672", "-q", "--out", str(out)]) == 0
    ds = TextClsDataset.load(out)
    assert ds.labels == ["World", "Sports", "Business", "Sci/Tech"]
    for split, n in (("train", 5600), ("val", 500), ("test", 1500)):
        assert np.bincount(ds.targets[ds.rows(split)]).tolist() == [n // 4] * 4
    assert "\\n" not in " ".join(ds.texts)


def test_metrics_against_hand_computation() -> None:
    truth = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    pred = np.array([0, 0, 1, 1, 2, 2, 2, 2, 0])
    cm = confusion_matrix(truth, pred, 3)
    assert cm.tolist() == [[2, 1, 0], [0, 1, 1], [1, 0, 3]]
    m = classification_metrics(truth, pred, ["a", "b", "c"])
    assert m["accuracy"] == pytest.approx(100 * 6 / 9)
    # by hand: precision a 2/3, b 1/2, c 3/4; recall a 2/3, b 1/2, c 3/4 -> F1 equal to both
    expected = [(2 / 3, 2 / 3), (1 / 2, 1 / 2), (3 / 4, 3 / 4)]
    for c, (prec, rec) in zip(m["per_class"], expected, strict=True):
        assert c["precision"] == pytest.approx(100 * prec) and c["recall"] == pytest.approx(100 * rec)
        assert c["f1"] == pytest.approx(100 * 2 * prec * rec / (prec + rec))
    assert m["macro_f1"] == pytest.approx(100 * (2 / 3 + 1 / 2 + 3 / 4) / 3)
    assert [c["support"] for c in m["per_class"]] == [3, 2, 4]
    # a class never predicted: precision 0, flagged, macro-F1 still defined
    m = classification_metrics(np.array([0, 1, 1]), np.array([0, 0, 0]), ["a", "b"])
    assert m["per_class"][1]["precision"] == 0 and m["per_class"][1]["warning"] == "never predicted"
    assert m["macro_f1"] == pytest.approx(100 * (2 * (1 / 3) * 1 / (1 / 3 + 1)) / 2)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return prepare_tiny_textcls(tmp_path_factory.mktemp("textcls"))


def _metrics(run: Path) -> list[dict]:
    drop = ("time_s", "train_time_s", "val_time_s", "texts_per_s")
    return [{k: v for k, v in json.loads(line).items() if k not in drop}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_classify_run_directory_dry_run_and_exact_resume(prepared: Path, tmp_path: Path, capsys,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from train.classification.fit import ClassificationTrainer

    assert train_main(["classify", "--data", str(prepared), *TINY, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "softmax head" in out and "about 1,500,000 parameters" in out and "200,000-word" in out

    common = ["classify", "--data", str(prepared), *TINY, "--epochs", "2", "--checkpoint-every", "2", "-q"]
    straight = tmp_path / "straight"
    assert train_main([*common, "--out", str(straight)]) == 0
    for name in ("config.json", "metrics.jsonl", "train.log", "curves.png", "eval/test.json",
                 "checkpoints/best.pt", "checkpoints/last.pt"):
        assert (straight / name).is_file(), name
    records = _metrics(straight)
    assert [r["epoch"] for r in records] == [1, 2]
    assert "val_accuracy" in records[0] and "rsum" not in records[0]
    config = json.loads((straight / "config.json").read_text())
    assert config["task"] == "classify" and config["labels"] == ["World", "Sports"]

    # killed in epoch 2 after its first mid-epoch checkpoint (6 batches per epoch, one every 2 steps)
    real_step, calls = ClassificationTrainer._step, []

    def dying_step(self, batch):
        calls.append(1)
        if len(calls) == 10:
            raise KeyboardInterrupt
        return real_step(self, batch)

    monkeypatch.setattr(ClassificationTrainer, "_step", dying_step)
    killed = tmp_path / "killed"
    assert train_main([*common, "--out", str(killed)]) == 130
    monkeypatch.setattr(ClassificationTrainer, "_step", real_step)
    state = torch.load(killed / "checkpoints" / "last.pt", weights_only=False)
    assert state["epoch"] == 1 and state["position"] == 2
    assert train_main(["classify", "--out", str(killed), "--resume", "-q"]) == 0
    assert _metrics(killed) == records
    for name in ("last.pt", "best.pt"):
        a = torch.load(killed / "checkpoints" / name, weights_only=False)["model"]
        b = torch.load(straight / "checkpoints" / name, weights_only=False)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert json.loads((killed / "eval" / "test.json").read_text())["confusion"] == \
        json.loads((straight / "eval" / "test.json").read_text())["confusion"]
    # a changed setting refuses to resume, naming it
    assert train_main(["classify", "--out", str(killed), "--resume", "--dropout", "0.3"]) == 2
    assert "settings.dropout was 0.1, now 0.3" in capsys.readouterr().err


def test_predict_evaluate_and_load_run(prepared: Path, tmp_path: Path, capsys) -> None:
    from train.classification.run import ClassificationRun, load_classification_run
    from train.retrieval.open import load_run

    run_dir = tmp_path / "run"
    assert train_main(["classify", "--data", str(prepared), *TINY, "--epochs", "1", "-q", "--out",
                       str(run_dir)]) == 0
    capsys.readouterr()
    texts = ["paris summit and treaty", "goal match and cup"]
    assert train_main(["predict", "--run", str(run_dir), "--text", *texts, "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    run = load_classification_run(run_dir)
    assert isinstance(run, ClassificationRun)
    with pytest.raises(UserError, match="a text classification run"):
        load_run(run_dir)  # the retrieval reader: a one-line error naming the other
    probs = run.probabilities(texts)
    assert [x["text"] for x in lines] == texts
    for line, row in zip(lines, probs, strict=True):
        assert line["label"] == run.labels[int(row.argmax())]
        assert line["probability"] == pytest.approx(float(row.max()), abs=1e-6)
        assert sum(line["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)
    file = tmp_path / "texts.txt"
    file.write_text("\n".join(texts) + "\n\n", encoding="utf-8")
    assert train_main(["predict", "--run", str(run_dir), "--file", str(file)]) == 0
    plain = capsys.readouterr().out.splitlines()
    # every line answered in order: the trailing blank line gets the empty answer
    assert [p.split("\t")[0] for p in plain] == [x["label"] for x in lines] + [""]
    assert train_main(["predict", "--run", str(run_dir)]) == 2
    # retrieval commands refuse a classification run in one line
    assert train_main(["query", "--run", str(run_dir), "--text", "x"]) == 2
    assert "a text classification run" in capsys.readouterr().err

    assert train_main(["evaluate", "--run", str(run_dir), "--noise", "0.1,0.25"]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "noise robustness" in out
    noise = json.loads((run_dir / "eval" / "noise_test.json").read_text())
    assert [r["ratio"] for r in noise["ratios"]] == [0.1, 0.25]
    assert (run_dir / "eval" / "noise_test.png").stat().st_size > 0
    assert noise["clean"]["accuracy"] == pytest.approx(json.loads((run_dir / "eval" / "test.json")
                                                                  .read_text())["accuracy"])


def test_pipeline_schema_of_a_classification_pipeline(tmp_path: Path) -> None:
    from pipelines.schema import load_pipelines

    file = tmp_path / "pipelines.yaml"
    body = ("pipelines:\n  p:\n    description: d\n"
            "    prep: {dataset: textcls, train_file: a.csv, test_fraction: 0.2, out: data}\n"
            "    classify: {encoder: oecc, arch: A, out: runs/p}\n    evaluate: {noise: '0.1,0.2'}\n")
    file.write_text(body, encoding="utf-8")
    pipe = load_pipelines(file)["p"]
    assert pipe.classify.data == str(tmp_path / "data") and pipe.classify.arch == "A"
    file.write_text(body.replace("arch: A", "version: v2"), encoding="utf-8")
    with pytest.raises(UserError, match="'version' applies to encoder chain, not 'oecc'"):
        load_pipelines(file)
