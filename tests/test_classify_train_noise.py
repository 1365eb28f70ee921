"""``train classify --train-noise P``: the character noise of ``--noise`` evaluation applied to the training
texts, fresh every epoch, seeded, and exact across a resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from prep.cli import main as prep_main
from train.classification.model import NoisyTexts, with_training_noise
from train.cli import main as train_main
from train.engine.codecs import TextCodec
from train.engine.noise import add_character_noise, training_noise
from train.models.classifier import classify_settings

TINY = ["--encoder", "chain", "--p", "0.0625", "--max-chars", "48", "--batch-size", "8", "--dropout", "0.1",
        "--device", "cpu"]
TEXTS = ["paris summit and treaty", "goal match and cup", "minister election", "coach score league"]


def test_training_noise_is_the_evaluation_noise_seeded_by_seed_epoch_and_text() -> None:
    alphabet = sorted(set("".join(TEXTS)))
    a = training_noise(TEXTS, [0, 1, 2, 3], 0.25, alphabet, seed=7, epoch=2)
    assert a != TEXTS and [len(t) for t in a] == [len(t) for t in TEXTS]
    # the batch a text is in, and the order, change nothing
    assert training_noise(TEXTS, [3, 1], 0.25, alphabet, seed=7, epoch=2) == [a[3], a[1]]
    # the same replacement as --noise evaluation, with its own seed
    rng = np.random.default_rng([7, 2, 1])
    assert add_character_noise([TEXTS[1]], 0.25, alphabet, rng) == [a[1]]
    assert training_noise(TEXTS, [0, 1, 2, 3], 0.25, alphabet, seed=7, epoch=3) != a
    assert training_noise(TEXTS, [0, 1, 2, 3], 0.25, alphabet, seed=8, epoch=2) != a


def test_noisy_texts_encode_their_noise_and_zero_is_no_noise(tmp_path: Path) -> None:
    from prep.dataset import Vocabulary

    symbols = ["<pad>", "<unk>", *sorted(set("".join(TEXTS)))]
    vocab = Vocabulary(symbols=symbols, counts={}, min_count=1, lowercase=True, pad="<pad>", unk="<unk>")
    codec = TextCodec("chars", vocab, 64)
    codes = [codec.encode(t, ()) for t in TEXTS]
    from train.classification.model import LabelledTexts

    clean = LabelledTexts(codes, np.arange(4, dtype=np.int64), codec, list(TEXTS))
    assert with_training_noise(clean, 0.0, 0) is clean
    noisy = with_training_noise(clean, 0.2, 5)
    assert isinstance(noisy, NoisyTexts)
    noisy.epoch = 1
    batch = noisy.batch([2, 0])
    expected = codec.encode_texts(training_noise(TEXTS, [2, 0], 0.2, noisy.alphabet, 5, 1))
    assert batch.text[0, : len(expected[0])].tolist() == expected[0].tolist()
    assert batch.labels.tolist() == [2, 0]
    assert not torch.equal(batch.text, clean.batch([2, 0]).text)
    with pytest.raises(ValueError):
        classify_settings(out="x", train_noise=1.0)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("noise")
    raw = root / "raw"
    raw.mkdir()
    (raw / "classes.txt").write_text("World\nSports\n", encoding="utf-8")
    rng = np.random.default_rng(0)
    world, sport = TEXTS[0].split() + TEXTS[2].split(), TEXTS[1].split() + TEXTS[3].split()
    rows = [f'"{k % 2 + 1}","{" ".join(rng.choice(world if k % 2 == 0 else sport, 3))}","news"'
            for k in range(64)]
    (raw / "train.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = root / "data"
    assert prep_main(["textcls", "--train", str(raw / "train.csv"), "--test-fraction", "0.2",
                      "--val-fraction", "0.25", "-q", "--out", str(out)]) == 0
    return out


def _records(run: Path) -> list[dict]:
    drop = ("time_s", "train_time_s", "val_time_s", "texts_per_s")
    return [{k: v for k, v in json.loads(line).items() if k not in drop}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_noise_resumes_exactly(prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from train.classification.fit import ClassificationTrainer

    common = ["classify", "--data", str(prepared), *TINY, "--epochs", "2", "--checkpoint-every", "2", "-q"]
    clean, straight, killed = tmp_path / "clean", tmp_path / "straight", tmp_path / "killed"
    assert train_main([*common, "--out", str(clean)]) == 0
    assert train_main([*common, "--train-noise", "0.2", "--out", str(straight)]) == 0
    records = _records(straight)
    assert [r["loss"] for r in records] != [r["loss"] for r in _records(clean)]
    assert json.loads((straight / "config.json").read_text())["settings"]["train_noise"] == 0.2

    real_step, calls = ClassificationTrainer._step, []

    def dying_step(self, batch):
        calls.append(1)
        if len(calls) == 8:  # in epoch 2, after its first mid-epoch checkpoint
            raise KeyboardInterrupt
        return real_step(self, batch)

    monkeypatch.setattr(ClassificationTrainer, "_step", dying_step)
    assert train_main([*common, "--train-noise", "0.2", "--out", str(killed)]) == 130
    monkeypatch.setattr(ClassificationTrainer, "_step", real_step)
    assert torch.load(killed / "checkpoints" / "last.pt", weights_only=False)["epoch"] == 1
    assert train_main(["classify", "--out", str(killed), "--resume", "-q"]) == 0
    assert _records(killed) == records
    a = torch.load(killed / "checkpoints" / "last.pt", weights_only=False)["model"]
    b = torch.load(straight / "checkpoints" / "last.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
