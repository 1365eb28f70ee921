"""How a training step runs, never what it computes (issue 44): ``--compile`` (captions padded to a few
lengths, the loss compiled), ``--cuda-graphs`` (refused where it cannot run), Adam on the CPU as it always
was, caption lengths kept on the host for the encoders that pack captions there.

The compiled steps compile C++ with inductor: about a minute per family on two loaded cores with a cold cache
(``~/.cache/vse-toolkit/inductor``), seconds with a warm one; ``VSE_TEST_COMPILE=0`` skips them (e.g. no
compiler). CUDA graphs can only run on a GPU: ``bench/gpu_check.py`` checks their steps against eager ones.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import TINY, safety_inputs, train_cli

from prep.dataset import PreparedDataset
from train.engine.codecs import codec_for
from train.engine.compiled import padded_length
from train.engine.data import load_caption_set, padded_batch, read_features
from train.engine.graphs import graph_problem
from train.engine.inference import batch_to
from train.engine.objectives import ScheduledContrastiveObjective
from train.engine.step import (
    TrainingStep,
    load_optimizer_state,
    make_optimizer,
    plain_learning_rates,
    wants_host_lengths,
)
from train.models.family import build_objective, model_spec, train_settings
from train.models.joint import build_model
from train.models.language_agnostic import ClmrEncoder
from train.models.self_attention import SEAMG
from train.models.uvs import UVSEncoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

needs_compile = pytest.mark.skipif(os.environ.get("VSE_TEST_COMPILE", "1") == "0",
                                   reason="VSE_TEST_COMPILE=0")

#: the families whose steps --compile must reproduce, at sizes that compile quickly; every caption is cut to
#: 16 characters (chain, oecc) or has 10 words (seam), so each family compiles one shape
SMALL = {"chain": {"p": 0.125, "d": 32, "max_chars": 16},
         "oecc": {"arch": "A", "d": 32, "max_chars": 16},
         "seam": {"variant": "C", "hops": 2, "d": 32, "penalty": 0.5}}
BATCH = 8
#: a compiled step against the eager one: the same expression, summed in another order
RTOL, ATOL = 1e-4, 1e-6
#: the weights after one step: Adam's first step moves a weight by ``lr * g / (|g| + eps)``, so a gradient
#: near ``eps`` (1e-8) turns its rounding into up to a few thousandths of ``lr`` (1e-3); seen: 4.6e-6 on 2
#: of oecc's 172,032 weights
WEIGHT_ATOL = 1e-5


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, str]:
    return safety_inputs(tmp_path_factory.mktemp("step"))


def family_step(data: tuple[Path, str], family: str, **options: Any) -> tuple[Any, Any, Any]:
    """``(settings, model, first batch)`` of ``family`` at :data:`SMALL` sizes (``options`` replacing
    some) on the tiny data; the batch collated as the loader does (not padded)."""
    prepared, features = data
    settings = train_settings(family=family, out="x", batch_size=BATCH, device="cpu", seed=0,
                              **{**SMALL[family], **options})
    dataset = PreparedDataset.load(prepared)
    spec = model_spec(settings)
    codec = codec_for(settings, dataset, spec.text_input)
    x, valid = read_features(features, dataset)
    captions = load_caption_set(dataset, x, valid, "train", "en", settings.max_chars, codec=codec)
    torch.manual_seed(0)
    model = build_model(settings, codec.vocab_size, x.shape[1:], spec)
    return settings, model, captions.batch(list(range(BATCH)))


def one_step(settings: Any, model: torch.nn.Module, batch: Any) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss of one :class:`TrainingStep` on ``batch`` and the parameters after it."""
    cpu = torch.device("cpu")
    optimizer = make_optimizer(model.parameters(), settings.lr, cpu)
    step = TrainingStep(model, build_objective(settings), optimizer, settings, cpu)
    loss = float(step(batch, 0))
    return loss, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_padded_lengths_are_few_and_never_shorter() -> None:
    assert [padded_length(t, 256) for t in (1, 8, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 250)] == \
        [8, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 256]
    assert padded_length(90, 100) == 96 and padded_length(99, 100) == 100 and padded_length(120, 100) == 120
    assert len({padded_length(t, 256) for t in range(1, 257)}) == 11


@pytest.mark.parametrize("family", sorted(SMALL))
def test_padded_captions_give_the_same_step(data, family) -> None:
    """Padding a batch's captions (what a compiled or graphed run does) changes no loss beyond rounding."""
    # captions cut to 14 characters (chain, oecc; seam's have 10 words): a length that pads (to 16 and 12)
    settings, model, batch = family_step(data, family, **({} if family == "seam" else {"max_chars": 14}))
    padded, length = padded_batch(batch, 64), batch.text.shape[1]
    assert padded.text.shape[1] == padded_length(length, 64) > length
    assert torch.equal(padded.text[:, :length], batch.text) and (padded.text[:, length:] == 0).all()
    assert torch.equal(padded.lengths, batch.lengths)
    loss, weights = one_step(settings, copy.deepcopy(model), batch)
    padded_loss, padded_weights = one_step(settings, model, padded)
    assert padded_loss == pytest.approx(loss, rel=RTOL)
    for key, value in weights.items():
        torch.testing.assert_close(padded_weights[key], value, rtol=RTOL, atol=WEIGHT_ATOL)


@needs_compile
@pytest.mark.parametrize("family", sorted(SMALL))
def test_a_compiled_step_gives_the_eager_steps_loss_and_weights(data, family, monkeypatch) -> None:
    monkeypatch.delenv("VSE_NO_COMPILE", raising=False)
    settings, model, batch = family_step(data, family)
    batch = padded_batch(batch, settings.max_chars if family != "seam" else settings.max_words)
    loss, weights = one_step(settings, copy.deepcopy(model), batch)
    compiled = settings.model_copy(update={"compile": True})
    cpu = torch.device("cpu")
    optimizer = make_optimizer(model.parameters(), compiled.lr, cpu)
    step = TrainingStep(model, build_objective(compiled), optimizer, compiled, cpu)
    assert step.static_shapes and step.compiled.takes(batch_to(batch, torch.device("cpu")))
    compiled_loss = float(step(batch, 0))
    assert step.compiled.fallback is None, step.compiled.fallback  # it did compile
    assert compiled_loss == pytest.approx(loss, rel=RTOL)
    for key, value in weights.items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=RTOL, atol=WEIGHT_ATOL)
    # a batch of another size (an epoch's last) steps eagerly, with the same objective
    fields = ("image_features", "text", "lengths", "image_index")
    last = padded_batch(batch._replace(**{f: getattr(batch, f)[:3] for f in fields}), 64)
    assert not step.compiled.takes(last) and float(step(last, 1)) > 0


@needs_compile
def test_a_compiled_run_trains_and_records_its_choice(data, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("VSE_NO_COMPILE", raising=False)
    prepared, features = data
    run = tmp_path / "run"
    argv = ["chain", "--data", str(prepared), "--features", features, *TINY, "--batch-size", str(BATCH),
            "--max-chars", "16", "--epochs", "3", "--compile", "--out", str(run)]
    assert train_cli(argv) == 0
    out = capsys.readouterr()
    assert "--compile" not in out.err  # no fallback warning: it compiled
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0] and all(loss > 0 for loss in losses)
    assert json.loads((run / "config.json").read_text())["settings"]["compile"] is True
    assert "checkpoints" in out.out and "s in the background" in out.out
    # an execution choice, like --device: a run resumes with or without it
    assert train_cli(["chain", "--out", str(run), "--resume", "--no-compile", "--epochs", "4"]) == 0
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4


def test_cuda_graphs_on_the_cpu_is_a_one_line_error(data, tmp_path, capsys) -> None:
    prepared, features = data
    argv = ["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "1", "--cuda-graphs",
            "--out", str(tmp_path / "run")]
    assert train_cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["train: error: --cuda-graphs: CUDA graphs need a CUDA device (this run is on cpu)"]
    assert not (tmp_path / "run" / "config.json").exists()


def test_graphs_are_refused_where_a_step_decides_on_the_host(data) -> None:
    cuda = torch.device("cuda")
    settings, model, _ = family_step(data, "chain")
    assert graph_problem(model, build_objective(settings), cuda) is None
    assert "GRU" in graph_problem(torch.nn.Sequential(torch.nn.GRU(4, 4)), build_objective(settings), cuda)
    assert "ScheduledContrastiveObjective" in graph_problem(model, ScheduledContrastiveObjective(), cuda)


def test_adam_on_the_cpu_is_the_default_implementation() -> None:
    params = [torch.nn.Parameter(torch.ones(3))]
    adam = make_optimizer(params, 1e-3, torch.device("cpu"))
    reference = torch.optim.Adam([torch.nn.Parameter(torch.ones(3))], lr=1e-3)
    assert adam.defaults == reference.defaults  # no fused, foreach or capturable: as before, bit for bit


def test_learning_rates_are_saved_as_numbers_and_loaded_as_the_run_needs() -> None:
    params = [torch.nn.Parameter(torch.ones(3))]
    graphed = torch.optim.Adam(params, lr=torch.tensor(0.01))  # as a capturable Adam holds it
    params[0].grad = torch.ones(3)
    graphed.step()
    state = plain_learning_rates(graphed.state_dict())
    lr = state["param_groups"][0]["lr"]
    assert lr == pytest.approx(0.01) and isinstance(lr, float)
    assert isinstance(state["state"][0]["step"], torch.Tensor)  # the moments and counts stay tensors
    plain = torch.optim.Adam([torch.nn.Parameter(torch.ones(3))], lr=1e-3)
    load_optimizer_state(plain, state)
    assert plain.param_groups[0]["lr"] == pytest.approx(0.01) and plain.param_groups[0]["fused"] is None
    again = torch.optim.Adam([torch.nn.Parameter(torch.ones(3))], lr=torch.tensor(1e-3))
    load_optimizer_state(again, state)
    assert isinstance(again.param_groups[0]["lr"], torch.Tensor) and float(again.param_groups[0]["lr"]) == \
        pytest.approx(0.01)
    schedule = torch.optim.lr_scheduler.StepLR(graphed, 2)
    assert all(isinstance(v, float) for v in plain_learning_rates(schedule.state_dict())["base_lrs"])


def test_caption_lengths_stay_on_the_host_for_an_encoder_that_packs_there(data) -> None:
    _, model, batch = family_step(data, "chain")
    assert not wants_host_lengths(model)
    packing = torch.nn.Module()
    packing.lengths_on_host = True
    assert wants_host_lengths(torch.nn.Sequential(model, packing))
    # the GRU families (vse, clmr, liwe) pack on the host; SEAM-G's GRU also masks on the device: not it
    assert wants_host_lengths(UVSEncoder(10, d=4, word_dim=4)) and wants_host_lengths(ClmrEncoder(10, 4, 4))
    assert not wants_host_lengths(SEAMG(10, word_dim=4, hops=1, attention_units=4, gru_units=4))
    kept = batch_to(batch, torch.device("cpu"), host_lengths=True)
    assert kept.lengths is batch.lengths and kept.image_features.dtype == torch.float32
    assert batch_to(batch, torch.device("cpu")).lengths is not None
