"""One optimisation step of the trainer, and the choices that change how it runs, never what it computes.

- **Adam**: on the CPU ``torch.optim.Adam`` as it always was (bit for bit); on CUDA the fused kernel (one
  launch for every parameter instead of one per tensor and operation), capturable with a device tensor as
  its learning rate under ``--cuda-graphs`` (:func:`make_optimizer`).
- **Caption lengths on the host**: a text encoder that packs its captions for a GRU needs their lengths on
  the host; one that says so (``lengths_on_host = True``) gets them there, so it never copies them back from
  the device in the middle of its forward pass (:func:`wants_host_lengths`, :func:`train.engine.inference.
  batch_to`).
- ``--compile`` (:mod:`train.engine.compiled`) and ``--cuda-graphs`` (:mod:`train.engine.graphs`), both for
  the batches of ``batch_size`` captions; other batches (an epoch's last) step eagerly.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from train.engine.compiled import CompiledLoss
from train.engine.graphs import StepGraphs, graph_problem
from train.engine.inference import batch_to
from vsecore.device import autocast
from vsecore.errors import UserError


def make_optimizer(params: Any, lr: float, device: torch.device, graphs: bool = False) -> torch.optim.Adam:
    """The trainer's Adam at learning rate ``lr``: the default implementation on the CPU (every CPU result
    unchanged), the fused one on CUDA, capturable with a device tensor as learning rate for CUDA graphs
    (a schedule then fills that tensor; a float would be recorded in the graph)."""
    if device.type != "cuda":
        return torch.optim.Adam(params, lr=lr)
    if graphs:
        return torch.optim.Adam(params, lr=torch.tensor(lr, device=device), fused=True, capturable=True)
    return torch.optim.Adam(params, lr=lr, fused=True)


def plain_learning_rates(state: dict[str, Any]) -> dict[str, Any]:
    """An optimiser's or a schedule's ``state_dict`` with its learning rates as floats (a capturable Adam's
    are 0-dim tensors), so a checkpoint reads the same whichever way the run stepped."""
    def plain(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point():
            return float(value)
        return [plain(v) for v in value] if isinstance(value, list) else value

    out = dict(state)
    if "param_groups" in out:  # an optimiser: its groups' numbers (the moments in "state" stay tensors)
        out["param_groups"] = [{k: plain(v) for k, v in group.items()} for group in out["param_groups"]]
    else:  # a schedule: its learning rates (base_lrs, _last_lr, ...)
        out = {k: plain(v) for k, v in out.items()}
    return out


#: the keys of an optimiser's parameter group that say how it steps, not what it computes
IMPLEMENTATION_KEYS = ("foreach", "fused", "capturable", "differentiable")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``, keeping this run's implementation (a checkpoint of a CUDA run
    names the fused kernel, one of a CPU run the default) and its kind of learning rate (a device tensor
    under ``--cuda-graphs``, else a float); a fused or capturable Adam's step counts go to its device."""
    groups = [({k: g[k] for k in IMPLEMENTATION_KEYS if k in g}, g["lr"]) for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, (implementation, lr) in zip(optimizer.param_groups, groups, strict=True):
        group.update(implementation)
        if isinstance(lr, torch.Tensor):
            group["lr"] = torch.tensor(float(group["lr"]), device=lr.device)
        on_device = group.get("fused") or group.get("capturable")
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if on_device and isinstance(step, torch.Tensor) and step.device != param.device:
                optimizer.state[param]["step"] = step.to(param.device, torch.float32)


def wants_host_lengths(model: torch.nn.Module) -> bool:
    """Whether a module of ``model`` reads its caption lengths on the host (``lengths_on_host = True``:
    a GRU's packing)."""
    return any(getattr(m, "lengths_on_host", False) for m in model.modules())


class TrainingStep:
    """Forward, loss, backward, gradient clipping and Adam on one batch, with the run's step options.

    Args:
        model, objective, optimizer: the trainer's.
        settings: the run's settings (``grad_clip``, ``amp``, ``batch_size``, ``compile``, ``cuda_graphs``).
        device: where the step runs.
    """

    def __init__(self, model: torch.nn.Module, objective: Any, optimizer: torch.optim.Optimizer,
                 settings: Any, device: torch.device) -> None:
        self.model, self.objective, self.optimizer = model, objective, optimizer
        self.settings, self.device = settings, device
        self.host_lengths = device.type == "cuda" and wants_host_lengths(model)
        self.compiled = CompiledLoss(objective, settings.batch_size) if getattr(settings, "compile", False) \
            else None
        self.graphs: StepGraphs | None = None
        if getattr(settings, "cuda_graphs", False):
            problem = graph_problem(model, objective, device)
            if problem is not None:
                raise UserError(f"--cuda-graphs: {problem}")
            self.graphs = StepGraphs(self._whole_step, self._zero_grad, settings.batch_size)

    @property
    def static_shapes(self) -> bool:
        """Whether steps want a few fixed caption lengths (``--compile``, ``--cuda-graphs``)."""
        return self.compiled is not None or self.graphs is not None

    def use_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Step with a new optimiser (a curriculum's next phase); graphs of the old one are dropped."""
        self.optimizer = optimizer
        if self.graphs is not None:
            self.graphs = StepGraphs(self._whole_step, self._zero_grad, self.settings.batch_size)

    def _autocast(self) -> Any:
        return autocast(self.device, self.settings.amp)

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _loss(self, batch: Any, step: int) -> torch.Tensor:
        """The objective's loss of ``batch``: compiled where ``--compile`` takes it, else eager."""
        if self.compiled is not None and self.compiled.takes(batch):
            return self.compiled(self.model, batch, step, self._autocast)
        return self.objective(self.model, batch, step, self._autocast)

    def _update(self, loss: torch.Tensor) -> None:
        """Backward, clipping and Adam (the gradients were set to None before)."""
        loss.backward()
        s = self.settings
        if s.grad_clip is not None and s.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip)
        self.optimizer.step()

    def _whole_step(self, batch: Any, step: int = 0) -> torch.Tensor:
        """What a CUDA graph records: loss, backward, clipping, Adam (the objective is stateless)."""
        loss = self._loss(batch, step)
        self._update(loss)
        return loss.detach()

    def __call__(self, batch: Any, step: int) -> torch.Tensor:
        """One step on ``batch`` (on the host) at global ``step``; its loss, a 0-dim tensor on the device,
        not read (reading it waits for the device)."""
        batch = batch_to(batch, self.device, host_lengths=self.host_lengths)
        if self.graphs is not None and self.graphs.takes(batch):
            with self._compiling(batch):
                return self.graphs(batch)
        if self.compiled is None or not self.compiled.takes(batch):
            loss = self._loss(batch, step)
            self._zero_grad()
            self._update(loss)
            return loss.detach()
        return self._compiled_step(batch, step)

    def _compiled_step(self, batch: Any, step: int) -> torch.Tensor:
        """:meth:`__call__` through the compiled loss; a compilation that fails warns once and the step is
        taken eagerly (its gradients cleared first)."""
        before = self.objective.state_dict()  # a schedule the failed call advanced is put back
        try:
            with self.compiled.compiling(batch):
                loss = self._loss(batch, step)
                self._zero_grad()
                loss.backward()
        except Exception as exc:  # noqa: BLE001 - any compiler failure: go on eagerly, never crash
            self.compiled.failed(exc)
            self.objective.load_state_dict(before)
            loss = self.objective(self.model, batch, step, self._autocast)
            self._zero_grad()
            loss.backward()
        s = self.settings
        if s.grad_clip is not None and s.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip)
        self.optimizer.step()
        return loss.detach()

    def _compiling(self, batch: Any) -> Any:
        """A graph's warm-up steps may compile (``--compile --cuda-graphs``): the cache folder is held."""
        return self.compiled.compiling(batch) if self.compiled is not None else contextlib.nullcontext()
