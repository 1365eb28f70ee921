"""``bench/gpu_check.py``'s training stage (issue 44): how fast each family's step runs on the device, each
way of running it, and whether every way gives the eager step's numbers.

For each family (its COCO defaults and feature shape, as the ``steps`` stage), at batch 128 and 512, from the
same weights over the same batches (captions padded to one length, as a compiled run pads them):

- ``eager``: the trainer's step as a run takes it on CUDA (fused Adam); ``eager_foreach`` (batch 128): the
  same with PyTorch's default (foreach) Adam, the step before fused Adam;
- ``compile`` (batch 128): ``--compile``; ``graphs``: ``--cuda-graphs`` where the family allows it (chain,
  oecc, seam; the others record why not); ``compile_graphs`` (batch 128): both;

each with step ms, captions/s and peak device memory over ``train_steps`` steps after its warm-up (the
compilation and the captures, timed as ``first_s``), and its losses over the first ``check_steps`` steps
and its weights after them against ``eager``'s (relative differences: a compiled or graphed step must give
the eager step's numbers to float rounding), ``eager``'s first-batch loss against the CPU's; for graphs,
whether a learning rate set to 0 stops the replayed step (the schedule reaches the graph).
Then the checkpoint of the largest model: its synchronous write against the trainer's background one (the
seconds the loop waits, the seconds it takes, and steps taken meanwhile); and the targets: chain, oecc and
seam at batch 128 at least 3 times the captions/s of docs/scale.md's H200 table, vse, clmr and liwe 1.5
times, and the loader stage's fed clmr step at least 90% of the step alone.

``--dry`` runs tiny sizes and compiles nothing unless ``GPU_CHECK_DRY_COMPILE=1`` (then chain only): the
compiler needs a minute or more on a CPU.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gpu_check_data import (
    DRY_WORDS,
    WORDS,
    caption_set,
    codec_of,
    peak_mib,
    random_features,
    relative_difference,
    reset_peak,
    sync,
    timed,
)

from train.engine.checkpoint_writer import CheckpointWriter
from train.engine.data import padded_batch
from train.engine.graphs import WARMUP, graph_problem
from train.engine.inference import batch_to
from train.engine.step import TrainingStep, make_optimizer
from train.models.family import build_objective, model_spec
from train.models.joint import build_model
from train.run.checkpoint import save_checkpoint

#: captions/s of each family's float32 step at batch 128 before issue 44 (docs/scale.md, H200, the better
#: of two runs), and the factor issue 44 asks of the best way now
TODAY = {"chain": 11_217, "oecc": 18_900, "seam": 26_047, "vse": 17_602, "clmr": 9_914, "liwe": 10_035}
TARGET = {"chain": 3.0, "oecc": 3.0, "seam": 3.0, "vse": 1.5, "clmr": 1.5, "liwe": 1.5}
#: the fed step's share of the step alone that issue 44 asks for
FED_TARGET = 0.9
SIZES = {"real": {"batches": (128, 512), "train_steps": 50, "check_steps": 8, "train_images": 2048,
                  "compile_families": ("chain", "oecc", "seam", "vse", "clmr", "liwe")},
         "dry": {"batches": (8, 16), "train_steps": 2, "check_steps": WARMUP + 2, "train_images": 24,
                 "compile_families": ("chain",) if os.environ.get("GPU_CHECK_DRY_COMPILE") == "1" else ()}}
#: the ways of stepping: (label, --compile, --cuda-graphs, fused Adam) and whether batch 512 takes them
WAYS = (("eager", False, False, True, True), ("eager_foreach", False, False, False, False),
        ("compile", True, False, True, False), ("graphs", False, True, True, True),
        ("compile_graphs", True, True, True, False))


def _helpers() -> Any:
    """``bench/gpu_check.py`` (the families' settings and feature shapes), imported when the stage runs:
    that script imports this module first."""
    import gpu_check

    return gpu_check


def training(check: Any, record: dict[str, Any]) -> None:
    """The stage: every family of ``--families``, then the checkpoint, then the targets (see module doc)."""
    sizes = SIZES["dry" if check.args.dry else "real"]
    record["sizes"] = {k: list(v) if isinstance(v, tuple) else v for k, v in sizes.items()}
    for family in check.args.families:
        record[family] = family_ways(check, family, sizes)
    record["checkpoint"] = checkpoint_timing(check, max(check.args.families, key=_model_size))
    record["targets"] = targets(check, record)


def _model_size(family: str) -> int:
    return {"vse": 3, "seam": 2, "clmr": 1}.get(family, 0)


def _pool(check: Any, family: str, batch: int, n: int) -> tuple[Any, list[Any], Any]:
    """``(settings, batches, data)``: the family's caption set and a pool of batches whose captions pad to
    one length (the most common), so that every way steps one shape."""
    gc = _helpers()
    shape, dtype = (gc.DRY_FEATURES[family] if check.args.dry else gc.FEATURES[family][0]), \
        gc.FEATURES[family][1]
    rng = np.random.default_rng(1)
    x = torch.from_numpy(random_features(shape, dtype, n, rng))
    counts = torch.full((n,), shape[0], dtype=torch.int64) if len(shape) == 2 else None
    settings = gc.family_settings(check, family, check.device, False).model_copy(update={"batch_size": batch})
    data = caption_set(x, codec_of(model_spec(settings).text_input, DRY_WORDS if check.args.dry else WORDS),
                       n, rng, counts)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).numpy()
    padded = [padded_batch(data.batch(order[k * batch:(k + 1) * batch]), data.codec.max_len)
              for k in range(len(order) // batch)]
    lengths = [b.text.shape[1] for b in padded]
    common = max(set(lengths), key=lengths.count)
    return settings, [b for b in padded if b.text.shape[1] == common][:8], (x.shape[1:], data.codec)


def family_ways(check: Any, family: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """Every way of :data:`WAYS` at every batch size for ``family``; ``eager``'s first loss against the
    CPU's."""
    out: dict[str, Any] = {}
    for batch in sizes["batches"]:
        settings, pool, (shape, codec) = _pool(check, family, batch, max(sizes["train_images"], 4 * batch))
        torch.manual_seed(0)
        model = build_model(settings, codec.vocab_size, shape, model_spec(settings))
        reference: dict[str, Any] | None = None
        for label, compile_, graphs, fused, at_large in WAYS:
            if batch != sizes["batches"][0] and not at_large:
                continue
            if compile_ and family not in sizes["compile_families"]:
                continue
            s = settings.model_copy(update={"compile": compile_, "cuda_graphs": graphs})
            why = graph_problem(model, build_objective(s), check.device) if graphs else None
            if why is not None:
                out[f"{label}_{batch}"] = {"refused": why}
                continue
            got = one_way(check, s, copy.deepcopy(model), pool, fused, sizes)
            if reference is None:
                reference = got
                got["first_loss_rel_diff_vs_cpu"] = _cpu_difference(check, s, model, pool[0])
            else:
                got["loss_rel_diff_vs_eager"] = relative_difference(got["losses"], reference["losses"])
                got["weights_rel_diff_vs_eager"] = relative_difference(got["weights"], reference["weights"])
            out[f"{label}_{batch}"] = got
    for got in out.values():  # the tensors compared above, as JSON
        got.pop("weights", None)
        if "losses" in got:
            got["losses"] = [round(v, 6) for v in got["losses"].tolist()]
    return out


def one_way(check: Any, settings: Any, model: torch.nn.Module, pool: list[Any], fused: bool,
            sizes: dict[str, Any]) -> dict[str, Any]:
    """One way of stepping from ``model``'s weights: its first ``check_steps`` losses and the weights after
    them, then its timed steps."""
    device = check.device
    reset_peak(device)
    model = model.to(device)
    optimizer = (make_optimizer(model.parameters(), settings.lr, device, settings.cuda_graphs) if fused
                 else torch.optim.Adam(model.parameters(), lr=settings.lr))
    step = TrainingStep(model, build_objective(settings), optimizer, settings, device)
    t0 = time.perf_counter()
    losses = [step(pool[k % len(pool)], k) for k in range(sizes["check_steps"])]
    sync(device)
    first_s = time.perf_counter() - t0
    weights = torch.cat([p.detach().reshape(-1).float().cpu() for p in model.parameters()])
    n = sizes["train_steps"]
    seconds = timed(lambda: [step(pool[k % len(pool)], k) for k in range(n)], device)
    batch = int(pool[0].lengths.shape[0])
    got = {"step_ms": round(1000 * seconds / n, 2), "captions_per_s": round(n * batch / seconds, 1),
           "peak_gpu_mib": peak_mib(device), "first_s": round(first_s, 2),
           "losses": torch.stack(losses).float().cpu(), "weights": weights,
           "padded_length": int(pool[0].text.shape[1])}
    if step.graphs is not None:
        got["graphs_captured"] = step.graphs.captured
        got["lr_0_keeps_weights"] = _lr_reaches_graph(step, optimizer, pool[0], device)
    if step.compiled is not None:
        got["compile_fallback"] = step.compiled.fallback
    return got


def _lr_reaches_graph(step: TrainingStep, optimizer: torch.optim.Optimizer, batch: Any,
                      device: torch.device) -> bool:
    """Whether a replayed step at learning rate 0 leaves the weights as they were (the graph reads the
    learning rate the schedule sets)."""
    before = [p.detach().clone() for p in step.model.parameters()]
    lrs = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"].fill_(0.0)
    step(batch, 0)
    same = all(torch.equal(a, p.detach()) for a, p in zip(before, step.model.parameters(), strict=True))
    for g, lr in zip(optimizer.param_groups, lrs, strict=True):
        g["lr"].copy_(lr) if isinstance(lr, torch.Tensor) else g.update(lr=lr)
    return same


def _cpu_difference(check: Any, settings: Any, model: torch.nn.Module, batch: Any) -> float:
    """The first batch's loss (eval mode, no gradient) on the device against the CPU's, relative."""
    losses = []
    for device in (torch.device("cpu"), check.device):
        m = copy.deepcopy(model).to(device).eval()
        with torch.no_grad():
            loss = build_objective(settings)(m, batch_to(batch, device), 0, contextlib.nullcontext)
            losses.append(float(loss))
    return relative_difference(torch.tensor(losses[1]), torch.tensor(losses[0]))


def checkpoint_timing(check: Any, family: str) -> dict[str, Any]:
    """``family``'s whole training state (model and Adam's moments) written as the trainer writes it: the
    synchronous write, and the background one (the seconds the loop waits for it, its own seconds)."""
    gc = _helpers()
    settings = gc.family_settings(check, family, check.device, False)
    shape = gc.DRY_FEATURES[family] if check.args.dry else gc.FEATURES[family][0]
    vocab = codec_of(model_spec(settings).text_input, DRY_WORDS if check.args.dry else WORDS).vocab_size
    torch.manual_seed(0)
    model = build_model(settings, vocab, shape, model_spec(settings)).to(check.device)
    optimizer = make_optimizer(model.parameters(), settings.lr, check.device)
    for p in model.parameters():  # Adam's moments exist after a step
        p.grad = torch.zeros_like(p)
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    out: dict[str, Any] = {"family": family, "parameters": sum(p.numel() for p in model.parameters())}
    with tempfile.TemporaryDirectory() as folder:
        seconds = timed(lambda: save_checkpoint(Path(folder) / "sync.pt", state), check.device)
        out["sync_s"] = round(seconds, 3)
        writer = CheckpointWriter()
        t0 = time.perf_counter()
        writer.submit(save_checkpoint, Path(folder) / "async.pt", state)
        out["loop_waits_s"] = round(time.perf_counter() - t0, 4)
        writer.wait()
        out["background_s"] = round(writer.seconds, 3)
        out["bytes"] = (Path(folder) / "async.pt").stat().st_size
    return out


def targets(check: Any, record: dict[str, Any]) -> dict[str, Any]:
    """Each family's best captions/s at the smallest batch against :data:`TODAY` x :data:`TARGET`, and the
    loader stage's fed clmr step against the step alone (when those stages ran)."""
    out: dict[str, Any] = {"device": check.out["machine"].get("device_name"),
                           "today_from": "H200, docs/scale.md"}
    small = record["sizes"]["batches"][0]
    for family in check.args.families:
        rates = {k: v["captions_per_s"] for k, v in record[family].items()
                 if k.endswith(f"_{small}") and "captions_per_s" in v}
        best = max(rates, key=rates.get)
        factor = rates[best] / TODAY[family]
        out[family] = {"best": best, "captions_per_s": rates[best], "x_today": round(factor, 2),
                       "target_x": TARGET[family], "met": factor >= TARGET[family]}
    loader, alone = check.out.get("loader") or {}, (check.out.get("steps.clmr") or {}).get("float32")
    fed = [v["captions_per_s"] for k, v in loader.items() if k.startswith("clmr_step_fed_workers_")]
    if fed and alone:
        share = max(fed) / alone["captions_per_s"]
        out["fed_clmr"] = {"best_fed_captions_per_s": max(fed), "share": round(share, 3),
                           "alone_captions_per_s": alone["captions_per_s"], "target": FED_TARGET,
                           "met": share >= FED_TARGET}
    return out
