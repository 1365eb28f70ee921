"""One trainer for every family: Adam, validation rsum, LR plateau decay, early stopping, resume.

The loop follows the CHAIN-VSE and OECC papers (section 3.2 of each): Adam at the default
learning rate, the learning rate divided by 10 when the validation sum of recalls stops
improving (``ReduceLROnPlateau`` in ``max`` mode, ``lr_decay_patience`` epochs), and early
stopping after ``early_stop`` epochs without improvement; ``epochs`` is the maximum.
``lr_schedule`` picks the schedule: ``plateau`` (that one), ``step`` (divided by 10 every
``lr_step`` epochs, SEAM's "/10 in the 15th epoch": the released code's ``lr * 0.1 ** (epoch //
15)`` with 0-based epochs, so epochs 1-15 at ``lr``, 16-30 at ``lr / 10``) or ``constant`` (the
FNE paper's pipelines).

Phases (curricula). An objective with phases (a :class:`train.engine.objectives.PhasedObjective`, e.g. the
FNE paper's PH and POE) does not stop where a plain run would (``early_stop`` epochs without a
better validation rsum, or ``epochs`` epochs): the trainer reloads the weights of the best
checkpoint, advances the objective, starts a fresh Adam at its ``later_lr`` (vse: ``finetune_lr``;
default ``lr``) and
a fresh schedule, and counts ``epochs`` and ``early_stop`` again from there. The best rsum carries
over, so ``best.pt`` is the best of all phases. The phase and the epoch it started at are in
every checkpoint and each ``metrics.jsonl`` record has ``phase``, so ``--resume`` continues either
phase exactly.

Exact resume. Each epoch's batches are drawn up front from a dedicated, seeded generator whose
state at the start of the epoch is kept; a checkpoint stores it with the index of the next batch,
the epoch's running sums and every global random state. A run killed anywhere (SIGKILL included)
and resumed from its newest checkpoint regenerates the same batch list, skips the batches already
done and continues with the same generator states, so on CPU it ends with the same weights and
metrics as a run that was never interrupted. Only the training steps move the global generators: the
validation, the checkpoint, metrics, curve and TensorBoard writes run with their states kept
(:func:`train.run.checkpoint.rng_states_kept`), and a resumed run puts the checkpoint's states back
when its first step is about to run, after its own set-up, so what a library draws there (on its first
use in the new process) cannot make the resumed run's generators, and its checkpoints, differ.
``metrics.jsonl`` is rewritten from the history kept inside the checkpoint, so it never holds an epoch
the checkpoint does not know about.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from train.engine.checkpoint_writer import CheckpointWriter
from train.engine.data import (
    CaptionSet,
    PairSet,
    batch_loader,
    epoch_batches,
    epoch_pair_batches,
)
from train.engine.inference import embed_caption_set
from train.engine.objectives import Objective, PhasedObjective
from train.engine.plots import plot_training_curves
from train.engine.settings import TrainSection
from train.engine.step import TrainingStep, load_optimizer_state, make_optimizer, plain_learning_rates
from train.run.checkpoint import (
    check_model_state,
    check_optimizer_state,
    load_checkpoint,
    newest_checkpoint,
    restore_rng_states,
    rng_states,
    rng_states_kept,
    save_checkpoint,
)
from train.run.layout import BEST, CURVES, LAST, TENSORBOARD, RunDir
from vsecore import console
from vsecore.console import progress
from vsecore.errors import UserError, resume_hint
from vsecore.io import write_json_atomic


def jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


#: scores the validation embeddings ``(images, captions, caption_image) -> (score, metrics JSON)``; the
#: task gives it (retrieval: :func:`train.retrieval.validation.retrieval_scorer`)
Scorer = Callable[[torch.Tensor, torch.Tensor, Any], "tuple[float, dict[str, Any]]"]
EpochHook = Callable[[dict[str, Any]], None]  # called with each epoch's metrics.jsonl record, once written


class Trainer:
    """Trains ``model`` on ``train_set``, validating on ``val_set`` each epoch, in ``run_dir``.

    ``scorer`` scores the validation embeddings (a subclass may override :meth:`validate` instead).
    ``objective(model, batch, step, autocast) -> scalar`` is the family's loss
    (:mod:`train.engine.objectives`); the trainer knows nothing else about the family. ``pair_sets``: aligned
    sentence pairs (cross-language loss); each caption batch then carries one batch of each
    (:attr:`train.engine.data.Batch.pairs`), drawn with the epoch's batches from the same seeded generator.
    """

    #: what :meth:`validate`'s score is, in the epoch lines and the curves (a subclass may score otherwise)
    score_label = "val rsum"
    items = "captions"  # what one training example is, in the progress bar and the epoch line

    def __init__(self, settings: TrainSection, model: torch.nn.Module, objective: Objective,
                 train_set: CaptionSet, val_set: CaptionSet, run_dir: Path, device: torch.device,
                 log: Callable[[str], None] = console.info, pair_sets: Sequence[PairSet] = (),
                 scorer: Scorer | None = None, on_epoch: EpochHook | None = None) -> None:
        self.settings = settings
        self.scorer = scorer
        self.on_epoch = on_epoch
        self.pair_sets = list(pair_sets)
        self.model = model.to(device)
        self.objective = objective
        self.train_set = train_set
        self.val_set = val_set
        self.run_dir = Path(run_dir)
        self.device = device
        self.log = log
        self.optimizer = self._make_optimizer(settings.lr)
        self.scheduler = self._make_scheduler()
        #: one step (the options of how it runs: --compile, --cuda-graphs, fused Adam, host lengths)
        self.stepper = TrainingStep(self.model, objective, self.optimizer, settings, device)
        #: checkpoints are written in the background (train.engine.checkpoint_writer)
        self.writer = CheckpointWriter()
        self.shuffle = torch.Generator().manual_seed(settings.seed)
        # position of the run; everything here goes into every checkpoint
        self.epoch = 0  # epochs completed
        self.position = 0  # batches of the current epoch completed
        self.global_step = 0
        self.epoch_start_shuffle = self.shuffle.get_state()
        self.running = {"loss_sum": 0.0, "batches": 0, "captions": 0, "train_time": 0.0}
        self.best_rsum = -math.inf
        self.bad_epochs = 0
        self.history: list[dict[str, Any]] = []
        self.finished = False
        self.phase_start_epoch = 0  # epochs completed when the objective's current phase began
        #: the generator states of the checkpoint resumed from, put back when the next step is about to run
        self._resumed_rng: dict[str, Any] | None = None
        self._tb_writer: Any = None  # None: not tried yet; False: TensorBoard is not installed

    def _make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        """Adam at ``lr`` for this run's device and step (:func:`train.engine.step.make_optimizer`)."""
        return make_optimizer(self.model.parameters(), lr, self.device,
                              graphs=bool(getattr(self.settings, "cuda_graphs", False)))

    def _make_scheduler(self) -> Any:
        """The ``lr_schedule`` of the settings over the current optimiser."""
        s = self.settings
        if s.lr_schedule == "step":
            return torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=s.lr_step, gamma=0.1)
        if s.lr_schedule == "constant":
            return torch.optim.lr_scheduler.LambdaLR(self.optimizer, _constant_lr)
        # threshold 0: the scheduler and early stopping agree on what "improved" means (strictly higher).
        # ReduceLROnPlateau decays once more than `patience` epochs went by without improvement; the
        # option means "after this many", hence the - 1
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            self.optimizer, mode="max", factor=0.1, patience=s.lr_decay_patience - 1, threshold=0.0)

    @property
    def phase_epochs(self) -> int:
        """Epochs completed in the objective's current phase (all epochs without phases)."""
        return self.epoch - self.phase_start_epoch

    def _has_next_phase(self) -> bool:
        return isinstance(self.objective, PhasedObjective) and self.objective.has_next_phase

    def can_continue(self) -> bool:
        """Whether the stopping rules (``epochs``, ``early_stop``) let this phase go on."""
        return self.phase_epochs < self.settings.epochs and self.bad_epochs < self.settings.early_stop

    def _next_phase(self) -> None:
        """Reload the best weights, advance the objective, fresh Adam and schedule (see module doc); the
        global generators kept (a resume from ``best.pt`` switches phase too, in another process)."""
        best = self.checkpoint_dir / BEST
        source = "the last weights (no best checkpoint)"
        self.writer.wait()  # best.pt may be being written
        if best.is_file():
            with rng_states_kept():
                state = load_checkpoint(best, map_location="cpu")
            self.model.load_state_dict(state["model"])
            source = f"the best checkpoint (epoch {state['epoch']}, val rsum {state['best_rsum']:.2f})"
        objective = self.objective
        assert isinstance(objective, PhasedObjective)
        objective.advance()
        self.phase_start_epoch = self.epoch
        self.bad_epochs = 0
        lr = objective.later_lr or self.settings.lr
        self.optimizer = self._make_optimizer(lr)
        self.stepper.use_optimizer(self.optimizer)
        self.scheduler = self._make_scheduler()
        self.log(f"phase {objective.phase + 1} ({objective.phase_name} of hinges) from "
                 f"{source}, lr {lr:.1e}")

    # -- checkpoints -------------------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        """``<run_dir>/checkpoints``."""
        return RunDir(self.run_dir).checkpoints

    def state(self) -> dict[str, Any]:
        """The whole training state as a ``torch.save``-able dictionary."""
        return {
            "model": self.model.state_dict(),
            "optimizer": plain_learning_rates(self.optimizer.state_dict()),
            "scheduler": plain_learning_rates(self.scheduler.state_dict()),
            "objective": self.objective.state_dict(),
            "epoch": self.epoch,
            "position": self.position,
            "global_step": self.global_step,
            "epoch_start_shuffle": self.epoch_start_shuffle,
            "running": dict(self.running),
            "best_rsum": self.best_rsum,
            "bad_epochs": self.bad_epochs,
            "history": list(self.history),
            "finished": self.finished,
            "phase_start_epoch": self.phase_start_epoch,
            "rng": rng_states(),
            "settings": self.settings.model_dump(),
        }

    def resume(self, log: Callable[[str], None]) -> Path | None:
        """Load the newest consistent checkpoint (``last.pt`` or ``best.pt``, whichever has gone further,
        :func:`train.run.checkpoint.newest_checkpoint`) after checking its tensor shapes against the model and
        optimiser; a run extended by a larger ``--epochs`` goes on. Returns the file resumed from.

        A run stopped before its first checkpoint starts from the first step (said in one line; None is
        returned). A run stopped between an epoch's ``best.pt`` and its ``last.pt`` gets the ``last.pt``
        that epoch would have written before it goes on (or ends, when that epoch was its last), so every
        file of the run ends as an uninterrupted run leaves it."""
        found = newest_checkpoint(self.checkpoint_dir, (LAST, BEST))
        if found is None:
            log(f"resuming {self.run_dir}: no checkpoint yet (stopped before the first one), so starting "
                "from the first step")
            return None
        path, state = found
        check_model_state(self.model, state["model"], str(path))
        check_optimizer_state(self.optimizer, state.get("optimizer", {}), str(path))
        try:
            self.load_state(state)
        except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserError(f"{path}: cannot continue from it with this code "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
        if self.finished and self.can_continue():
            self.finished = False
        where = (f"epoch {self.epoch + 1}, batch {self.position}" if self.position
                 else f"the end of epoch {self.epoch}")
        log(f"resuming {self.run_dir} from checkpoints/{path.name} at {where} (step {self.global_step})")
        if not self.finished and not self.can_continue() and self._has_next_phase():
            # best.pt written at the end of a phase, before the next one began (killed writing last.pt)
            self._next_phase()
        if path.name == BEST:  # best.pt is newer only when its epoch's last.pt was never written
            self.save(LAST)
        if self.history:
            with rng_states_kept():
                self._plot_curves()
        return path

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from a state written by :meth:`state` (model, optimiser, generators, position)."""
        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.objective.load_state_dict(state.get("objective", {}))
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.global_step = int(state["global_step"])
        self.epoch_start_shuffle = state["epoch_start_shuffle"]
        self.shuffle.set_state(self.epoch_start_shuffle)
        self.running = dict(state["running"])
        self.best_rsum = float(state["best_rsum"])
        self.bad_epochs = int(state["bad_epochs"])
        self.history = list(state["history"])
        self.finished = bool(state["finished"])
        self.phase_start_epoch = int(state.get("phase_start_epoch", 0))
        restore_rng_states(state["rng"])
        self._resumed_rng = state["rng"]
        with rng_states_kept():
            self.write_metrics()

    def save(self, name: str) -> None:
        """Write the current state to ``checkpoints/<name>`` atomically, in the background (the state is
        copied first; :class:`train.engine.checkpoint_writer.CheckpointWriter`)."""
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)  # there when save returns, as it always was
        self.writer.submit(save_checkpoint, self.checkpoint_dir / name, self.state())

    def metrics_record(self, record: dict[str, Any]) -> dict[str, Any]:
        """An epoch's history record as its line of ``metrics.jsonl`` (a task may rename its keys)."""
        return record

    def write_metrics(self, lines: list[str] | None = None) -> None:
        """Rewrite ``metrics.jsonl`` from the history (atomically): one JSON object per epoch (``lines``:
        those of :meth:`metrics_lines` taken before)."""
        path = RunDir(self.run_dir).metrics
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(self.metrics_lines() if lines is None else lines), encoding="utf-8")
        tmp.replace(path)

    def metrics_lines(self) -> list[str]:
        """The lines of ``metrics.jsonl`` for the history so far."""
        return [json.dumps(self.metrics_record(r), sort_keys=True) + "\n" for r in self.history]

    # -- the loop ----------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train until ``epochs``, early stopping or the end of a resumed run; returns the last record.

        An interruption or a disk error on the way ends with what the run directory kept (``epoch 3
        kept: re-run with --resume``, :meth:`train.run.layout.RunDir.kept`) in its one-line message, for
        every task that trains with this loop."""
        s = self.settings
        if self._resumed_rng is not None:
            # the resume's own work since (curves, config, log lines) must not shift the first step's draws
            restore_rng_states(self._resumed_rng)
            self._resumed_rng = None
        with resume_hint(RunDir(self.run_dir).kept):
            try:
                while not self.finished and self.phase_epochs < s.epochs:
                    self._train_epoch()
                    self._end_epoch()
                if not self.finished:  # reached the maximum number of epochs
                    self.finished = True
                    self.save(LAST)
            except BaseException:
                self.writer.wait(raise_error=False)  # the checkpoint being written is finished first
                raise
            self.writer.wait()
        return self.history[-1] if self.history else {}

    def _train_epoch(self) -> None:
        s = self.settings
        # the batch list of this epoch comes from the generator state at the epoch's start, also
        # when resuming mid-epoch, so the remaining batches are those an uninterrupted run sees
        self.shuffle.set_state(self.epoch_start_shuffle)
        batches = epoch_batches(self.train_set, s.batch_size, s.captions_per_epoch, self.shuffle)
        if self.position >= len(batches):  # a checkpoint is written mid-epoch only before its last batch
            raise UserError(f"{self.checkpoint_dir}: the checkpoint's position (batch {self.position}) is "
                            f"past the {len(batches)} batches of epoch {self.epoch + 1}; the file was "
                            "edited, or written for other data (resume from another checkpoint, or train "
                            "again)")
        pairs = [(ps, epoch_pair_batches(ps, len(batches), s.batch_size, self.shuffle)[self.position:])
                 for ps in self.pair_sets]
        remaining = batches[self.position:]
        # a compiled or graphed step is fixed to its shapes: captions padded to a few lengths
        pad = self.train_set.codec.max_len if self.stepper.static_shapes else None
        loader = batch_loader(self.train_set, remaining, workers=s.workers,
                              pin_memory=self.device.type == "cuda", pairs=pairs, pad_limit=pad)
        self.model.train()
        bar = progress(total=len(batches), initial=self.position, desc=f"epoch {self.epoch + 1}/{s.epochs}",
                       unit="batch")
        tick = time.perf_counter()
        # the step before's loss, read once this step's work is queued: reading a loss waits for the device,
        # and waiting on the step just queued would leave the device idle while the next batch comes in
        pending: tuple[float | torch.Tensor, int] | None = None
        for batch in loader:
            loss = self._step(batch)
            self._add_loss(pending, bar)
            pending = (loss, self.global_step + 1)
            now = time.perf_counter()
            self.running["train_time"] += now - tick
            tick = now
            self.running["batches"] += 1
            self.running["captions"] += int(batch.lengths.shape[0])
            self.position += 1
            self.global_step += 1
            bar.update(1)
            if self.global_step % s.checkpoint_every == 0 and self.position < len(batches):
                self._add_loss(pending, bar)
                pending = None
                self.save(LAST)
                tick = time.perf_counter()  # checkpoint writing is not training time
        self._add_loss(pending, bar)
        bar.close()

    def _add_loss(self, pending: tuple[float | torch.Tensor, int] | None, bar: Any) -> None:
        """Add a step's loss (``(loss, step number)``; None: nothing) to the running sum, after checking it is
        finite (before any checkpoint is written: ``last.pt`` always holds a finite state)."""
        if pending is None:
            return
        loss, step = float(pending[0]), pending[1]
        if not math.isfinite(loss):
            raise UserError(f"the loss is {loss} at epoch {self.epoch + 1}, step {step}; "
                            "checkpoints/last.pt holds the last finite state (try a lower --lr or "
                            "--grad-clip)")
        self.running["loss_sum"] += loss
        rate = self.running["captions"] / max(self.running["train_time"], 1e-9)
        bar.set_postfix(loss=f"{loss:.4f}", **{f"{self.items}_per_s": f"{rate:.0f}"}, refresh=False)

    def _step(self, batch: Any) -> torch.Tensor:
        """One optimisation step on ``batch`` (:class:`train.engine.step.TrainingStep`); its loss, a 0-dim
        tensor on the device, not read (reading it waits for the device)."""
        return self.stepper(batch, self.global_step)

    def _plot_curves(self) -> None:
        """``curves.png`` of the history so far."""
        plot_training_curves(self.history, self.run_dir / CURVES, title=self.run_dir.name,
                             score_label=self.score_label.replace("val ", "validation "))

    def _tensorboard(self, record: dict[str, Any]) -> None:
        """Per-epoch scalars in ``RUN_DIR/tensorboard`` when TensorBoard is installed (else nothing)."""
        if self._tb_writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # optional: torch.utils.tensorboard needs the tensorboard package
                self._tb_writer = False
                return
            # purge_step: a resumed run replaces what an interrupted one logged after its checkpoint
            self._tb_writer = SummaryWriter(str(self.run_dir / TENSORBOARD), purge_step=record["epoch"])
        if self._tb_writer is False:
            return
        for key in ("loss", "rsum", "lr", "captions_per_s"):
            self._tb_writer.add_scalar(f"train/{key}" if key != "rsum" else "val/rsum", record[key],
                                       record["epoch"])
        self._tb_writer.flush()

    def validate(self) -> tuple[float, dict[str, Any]]:
        """Embed the validation split and score it with :attr:`scorer`: ``(score, metrics JSON)``."""
        if self.scorer is None:
            raise NotImplementedError("the Trainer validates with the scorer its task gives it "
                                      "(train.retrieval.validation.retrieval_scorer) "
                                      "or a subclass's validate")
        images, captions = embed_caption_set(self.model, self.val_set, self.device, amp=self.settings.amp)
        return self.scorer(images, captions, self.val_set.caption_image)

    def _end_epoch(self) -> None:
        s = self.settings
        t0 = time.perf_counter()
        with rng_states_kept():
            rsum, metrics = self.validate()
        val_time = time.perf_counter() - t0
        lr = float(self.optimizer.param_groups[0]["lr"])  # a device tensor under --cuda-graphs
        improved = rsum > self.best_rsum
        if improved:
            self.best_rsum = rsum
            self.bad_epochs = 0
        else:
            self.bad_epochs += 1
        if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.scheduler.step(rsum)
        else:
            self.scheduler.step()
        record = self._epoch_record(lr, rsum, improved, metrics, val_time)
        self.history.append(record)
        self.epoch += 1
        self.position = 0
        self.epoch_start_shuffle = self.shuffle.get_state()
        self.running = {"loss_sum": 0.0, "batches": 0, "captions": 0, "train_time": 0.0}
        next_phase = False
        if not self.can_continue():
            next_phase = self._has_next_phase()
            self.finished = not next_phase
        if improved:
            self.save(BEST)
        if next_phase:
            self._next_phase()
        self.save(LAST)
        # an epoch ends with its checkpoints on disk (then metrics.jsonl, which must not hold an epoch they
        # do not know); only the checkpoints within an epoch are left to the background
        self.writer.wait()
        with rng_states_kept():
            self.write_metrics()
            self._plot_curves()
            self._tensorboard(record)
            if self.on_epoch is not None:  # a fresh dict (the caller may keep it), drawing from kept states
                self.on_epoch(json.loads(self.metrics_lines()[-1]))
        note = " (best)" if improved else f" ({self.bad_epochs} without improvement)"
        if self.finished and self.bad_epochs >= s.early_stop:
            plural = "" if s.early_stop == 1 else "s"
            note += f"; early stop after {s.early_stop} epoch{plural} without improvement"
        self.log(f"epoch {record['epoch']}: loss {record['loss']:.4f}, lr {lr:.1e}, {self.score_label} "
                 f"{rsum:.2f}{note}, {record['captions_per_s']:.0f} {self.items}/s, "
                 f"{self.writer.since_last_report()}, {record['time_s']:.1f}s")

    def _epoch_record(self, lr: float, rsum: float, improved: bool, metrics: dict[str, Any],
                      val_time: float) -> dict[str, Any]:
        """The history record of the epoch that ends (its running sums, its validation)."""
        r = self.running
        record = {
            "epoch": self.epoch + 1,
            "step": self.global_step,
            "loss": r["loss_sum"] / max(r["batches"], 1),
            "lr": lr,
            "rsum": rsum,
            "best_rsum": self.best_rsum,
            "improved": improved,
            "val": metrics,
            "captions": r["captions"],
            "time_s": r["train_time"] + val_time,
            "train_time_s": r["train_time"],
            "val_time_s": val_time,
            "captions_per_s": r["captions"] / max(r["train_time"], 1e-9),
        }
        if isinstance(self.objective, PhasedObjective):
            record["phase"] = self.objective.phase_name
        return record


def _constant_lr(epoch: int) -> float:
    """``lr_schedule: constant``: the factor of every epoch (a module function, so it pickles)."""
    return 1.0


def write_evaluation(path: Path, record: dict[str, Any]) -> None:
    """Write an evaluation record (``eval/<split>.json``) atomically."""
    write_json_atomic(path, jsonable(record))
