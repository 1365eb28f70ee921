"""Checkpoints: atomic, pickle-free save and load of the whole training state, random generators included.

A checkpoint is one ``torch.save`` dictionary written to a temporary sibling file, flushed to
disk and renamed over the final name, so a run killed at any instant (SIGKILL included) leaves
either the previous complete checkpoint or the new complete one, never a torn file. SIGINT and
SIGTERM that arrive during the write are held back until the file is in place and then delivered
(:func:`deferred_signals`), so Ctrl-C never turns into a torch traceback half-way through a save.

Format 2 (:data:`FORMAT`, the ``"format"`` key). Everything in a checkpoint is a tensor, a plain
number, a string, ``None``, or a list, tuple or dict of those, so every reader opens it with
``torch.load(..., weights_only=True)``: a file that needs anything more (an arbitrary pickled
object, whose ``__reduce__`` could run a command) is refused with one line, never unpickled. The
random generator states, which numpy and Python give as tuples holding arrays, are stored as
tensors and numbers (:func:`rng_states`). Checkpoints written before format 2 pickled the numpy
state; :func:`convert_checkpoint` (``train convert-checkpoints``) re-saves them once, with the
unsafe loader, when the user asks for it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import signal
import threading
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from train.run.layout import BEST, LAST
from vsecore.errors import UserError, disk_error_reason
from vsecore.io import atomic_file

#: the checkpoint format this code writes and reads (the ``"format"`` key of every checkpoint)
FORMAT = 2
#: the command that re-saves a run's pre-format-2 checkpoints (see :func:`convert_checkpoint`)
CONVERT_COMMAND = "train convert-checkpoints --run RUN_DIR"
#: the signals held back while a checkpoint is written
DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- random generator states ------------------------------------------------------------------------
def rng_states() -> dict[str, Any]:
    """The global random generator states, as tensors and plain numbers (no pickle needed).

    Returns:
        ``{"torch": uint8 tensor, "cuda": [uint8 tensor per device], "numpy": {"keys": int64 (624,),
        "pos", "has_gauss", "cached_gaussian"}, "python": {"version", "state": int64 (625,),
        "gauss_next"}}``.
    """
    _, keys, pos, has_gauss, cached = np.random.get_state()
    version, state, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": int(version), "state": torch.tensor(state, dtype=torch.int64),
                   "gauss_next": gauss_next},
    }


def restore_rng_states(states: Mapping[str, Any]) -> None:
    """Put back the generator states saved by :func:`rng_states`.

    CUDA states are restored only when the same number of devices is present: resuming a GPU
    run on CPU is allowed, it just cannot be bit-identical.
    """
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    n = states["numpy"]
    np.random.set_state(("MT19937", np.asarray(n["keys"], dtype=np.int64).astype(np.uint32), int(n["pos"]),
                         int(n["has_gauss"]), float(n["cached_gaussian"])))
    p = states["python"]
    random.setstate((int(p["version"]), tuple(int(v) for v in p["state"].tolist()), p["gauss_next"]))


@contextlib.contextmanager
def rng_states_kept() -> Iterator[None]:
    """Run a block that is no training step with the global generators put back as they were after it.

    The trainer runs its validation, checkpoint and metrics writes, curves and TensorBoard records inside
    this block: whatever a library draws there from torch's, numpy's or Python's global generator (on its
    first use in a process, say) then moves no generator a checkpoint records. A run resumed in a new
    process, which does that first use at another point than the run it continues, so ends with the
    states of a run never stopped.
    """
    saved = rng_states()
    try:
        yield
    finally:
        restore_rng_states(saved)


def _plain_rng(legacy: Mapping[str, Any]) -> dict[str, Any]:
    """A format-1 ``rng`` entry (numpy's and Python's own tuples) in the form of :func:`rng_states`."""
    _, keys, pos, has_gauss, cached = legacy["numpy"]
    version, state, gauss_next = legacy["python"]
    return {
        "torch": legacy["torch"], "cuda": list(legacy.get("cuda") or []),
        "numpy": {"keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": int(version), "state": torch.tensor(list(state), dtype=torch.int64),
                   "gauss_next": None if gauss_next is None else float(gauss_next)},
    }


# -- what a checkpoint may hold ---------------------------------------------------------------------
_SCALARS = (bool, int, float, str, type(None))


def check_plain(obj: Any, where: str = "state") -> None:
    """Raise ``TypeError`` naming the first value of ``obj`` that would need pickle to store.

    Allowed: tensors, ``bool``/``int``/``float``/``str``/``None``, and lists, tuples and dicts (with
    string or integer keys) of those; exactly what ``torch.load(weights_only=True)`` reads back.
    """
    if isinstance(obj, (torch.Tensor, *_SCALARS)):
        return
    if isinstance(obj, list | tuple):
        for i, value in enumerate(obj):
            check_plain(value, f"{where}[{i}]")
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, str | int):
                raise TypeError(f"checkpoint {where}: key {key!r} of type {type(key).__name__} needs pickle")
            check_plain(value, f"{where}.{key}")
        return
    raise TypeError(f"checkpoint {where}: a {type(obj).__module__}.{type(obj).__qualname__} needs pickle; "
                    "store it as tensors, numbers, strings and lists")


# -- writing -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def deferred_signals(signals: tuple[int, ...] = DEFERRED_SIGNALS) -> Iterator[list[int]]:
    """Hold back ``signals`` inside the block; deliver each received one again when it ends.

    Python handlers run between bytecodes, so a SIGINT during ``torch.save`` would otherwise raise
    ``KeyboardInterrupt`` inside torch's writer (a ``RuntimeError: unexpected pos`` traceback). Here
    the write finishes (or fails and is cleaned up) first; then the signal takes its usual effect
    (``KeyboardInterrupt``, or termination for SIGTERM's default action). Outside the main thread,
    where handlers cannot be set, the block runs unprotected. Yields the list of received signals.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous: dict[int, Any] = {}

    def hold(signum: int, frame: Any) -> None:
        received.append(signum)

    for sig in signals:
        old = signal.getsignal(sig)
        if old is None:  # a handler installed outside Python: leave it alone
            continue
        previous[sig] = old
        signal.signal(sig, hold)
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        for sig in dict.fromkeys(received):
            signal.raise_signal(sig)


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write ``state`` (plus ``"format": FORMAT``) to ``path`` atomically, with signals held back.

    ``state`` must hold only what :func:`check_plain` allows (a ``TypeError`` names the value
    otherwise). A write that fails (a full disk) removes its temporary file, keeps the previous
    checkpoint and is a :class:`UserError` naming the file.
    """
    path = Path(path)
    state = {**state, "format": FORMAT}
    check_plain(state)
    with deferred_signals():
        try:
            with atomic_file(path, "wb") as fh:
                torch.save(state, fh)
        except (OSError, RuntimeError) as exc:
            disk = _disk_error(exc)
            reason = disk_error_reason(disk) if disk else _first_line(exc)
            raise UserError(f"{path}: could not write the checkpoint ({reason}); the previous checkpoint, if "
                            "any, is unchanged") from None


def _disk_error(exc: BaseException) -> OSError | None:
    """The disk's own error behind a failed save (full, read-only, ...): torch's writer reports a full disk
    as ``RuntimeError: ... unexpected pos N vs M``, with the ``OSError`` of the file's ``write`` as its
    context; None when no such error caused it."""
    seen: BaseException | None = exc
    for _ in range(8):  # the chain of causes is short; bounded against a cycle
        if seen is None:
            return None
        if isinstance(seen, OSError) and disk_error_reason(seen) is not None:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


# -- reading -----------------------------------------------------------------------------------------
def needs_pickle_message(path: str | os.PathLike) -> str:
    """The one-line refusal of a file that ``weights_only`` loading cannot read."""
    return (f"{path}: not a checkpoint this toolkit wrote, or written by a version before checkpoint "
            f"format {FORMAT} (it needs pickle, which is never run when a run is opened); if you wrote it "
            f"yourself, re-save it once with `{CONVERT_COMMAND}`")


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu", mmap: bool = False,
                    model: torch.nn.Module | None = None) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` with the pickle-free loader.

    The file is first opened with its tensors memory-mapped (nothing is inflated or copied: a
    compressed entry is refused) and every entry checked (:func:`check_format`; with ``model``, its
    tensors' names and shapes too, :func:`check_model_state`); only then are the tensors read, unless
    ``mmap`` asks to keep them mapped (a cheap check of a large file).

    Raises:
        UserError: (one line naming ``path``) missing, unreadable, needing pickle (a foreign file
            or one written before format 2), of another format, or holding an entry this code does
            not write or does not expect.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint")
    _check_archive(path)
    state = check_format(_torch_load(path, "cpu", mmap=True), path)
    if model is not None:
        check_model_state(model, state["model"], str(path))
    if mmap:
        return state
    del state
    return check_format(_torch_load(path, map_location, mmap=False), path)


def _check_archive(path: Path) -> None:
    """A one-line :class:`UserError` for a compressed entry in the checkpoint's zip archive: ``torch.save``
    stores every entry as it is, and a deflated one could inflate to gigabytes when read."""
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not an archive torch reads either: torch.load names what it is
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise UserError(f"{path}: holds a compressed entry {info.filename!r} of {info.file_size:,} bytes "
                            "(torch.save compresses none; not a checkpoint this toolkit wrote)")


def _torch_load(path: Path, map_location: str | torch.device, mmap: bool) -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        raise UserError(needs_pickle_message(path)) from None
    except Exception as exc:  # a damaged or foreign file: say which one
        raise UserError(f"{path}: not a readable checkpoint ({type(exc).__name__}: {_first_line(exc)})"
                        ) from None


def check_format(state: Any, path: str | os.PathLike) -> dict[str, Any]:
    """``state`` if it is a format-2 checkpoint dictionary (:func:`check_entries`), else a one-line
    :class:`UserError` naming ``path``."""
    if not isinstance(state, dict) or "format" not in state:
        raise UserError(needs_pickle_message(path))
    if state["format"] != FORMAT:
        raise UserError(f"{path}: checkpoint format {state['format']!r}, but this code reads format {FORMAT} "
                        "(use the toolkit version that wrote it)")
    model = state.get("model")
    if not isinstance(model, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in model.items()):
        raise UserError(f"{path}: its 'model' entry is not a dictionary of named tensors")
    check_entries(state, path)
    return state


#: the most parameters (and buffer values) a checkpoint's model may hold: 4 GiB of float32, 10 times the
#: largest model the families build at their papers' settings on COCO (OECC, about 80 million)
MAX_PARAMETERS = 1 << 30
#: bytes of the tensors of a checkpoint beyond its model's twice over (Adam's two moments): random
#: generator states (5 KiB each) and optimiser step counters
SMALL_TENSOR_BYTES = 1 << 20
#: integer entries of a checkpoint (``None``: absent in older checkpoints of format 2)
_COUNTS = ("epoch", "position", "global_step", "bad_epochs", "phase_start_epoch")
#: the entries :meth:`train.engine.trainer.Trainer.state` writes, and the type each must have
_ENTRIES: dict[str, type | tuple[type, ...]] = {
    "model": dict, "optimizer": dict, "scheduler": dict, "objective": dict, "epoch": int, "position": int,
    "global_step": int, "epoch_start_shuffle": torch.Tensor, "running": dict, "best_rsum": (int, float),
    "bad_epochs": int, "history": list, "finished": bool, "phase_start_epoch": int, "rng": dict,
    "settings": dict, "format": int}


def check_entries(state: dict[str, Any], path: str | os.PathLike) -> None:
    """A one-line :class:`UserError` naming ``path`` and the entry, unless every entry of ``state`` is one
    :meth:`~train.engine.trainer.Trainer.state` writes, of its type: counts (epoch, position, step, ...)
    whole numbers from 0 (a phase starting no later than its epoch), one ``history`` record per epoch
    done, optimiser parameter groups listing parameter numbers, and tensors outside the model no larger
    than the model's twice over (Adam's moments) plus :data:`SMALL_TENSOR_BYTES`. Run on the tensors
    memory-mapped, before any is read (an entry of gigabytes under an unknown key is refused unread)."""
    for key, value in state.items():
        kind = _ENTRIES.get(key) if isinstance(key, str) else None
        if kind is None:
            raise UserError(f"{path}: holds an entry {str(key)[:80]!r} that this toolkit does not write")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise UserError(f"{path}: its '{key}' entry is not {_type_name(kind)}")
        if key in _COUNTS and value < 0:
            raise UserError(f"{path}: its '{key}' entry is {value}, not a count from 0")
    if "epoch" not in state:
        raise UserError(f"{path}: its 'epoch' entry is not an integer")
    if state.get("phase_start_epoch", 0) > state["epoch"]:
        raise UserError(f"{path}: its 'phase_start_epoch' {state['phase_start_epoch']} is after its epoch "
                        f"{state['epoch']}")
    history = state.get("history")
    if history is not None and (len(history) != state["epoch"]
                                or not all(isinstance(r, dict) for r in history)):
        raise UserError(f"{path}: its 'history' is not one record per epoch done ({state['epoch']})")
    _check_optimizer_entry(state.get("optimizer"), path)
    model = sum(_tensor_bytes(v) for v in state["model"].values())
    if sum(t.numel() for t in state["model"].values()) > MAX_PARAMETERS:
        raise UserError(f"{path}: its model holds more than {MAX_PARAMETERS:,} values")
    rest = sum(_tensor_bytes(v) for k, v in state.items() if k != "model")
    if rest > 2 * model + SMALL_TENSOR_BYTES:
        raise UserError(f"{path}: holds {rest:,} bytes of tensors beside its model's {model:,}: more than an "
                        "optimiser and random generator states need")


def _type_name(kind: type | tuple[type, ...]) -> str:
    names = {dict: "a dictionary", int: "an integer", float: "a number", list: "a list",
             bool: "true or false", torch.Tensor: "a tensor"}
    return " or ".join(names.get(k, k.__name__) for k in (kind if isinstance(kind, tuple) else (kind,)))


def _check_optimizer_entry(optimizer: dict[str, Any] | None, path: str | os.PathLike) -> None:
    """An optimiser ``state_dict``: parameter groups listing distinct parameter numbers, per-parameter
    state keyed by those numbers."""
    if optimizer is None:
        return
    groups, per_param = optimizer.get("param_groups"), optimizer.get("state")
    if set(optimizer) != {"param_groups", "state"} or not isinstance(groups, list) or not isinstance(
            per_param, dict):
        raise UserError(f"{path}: its optimizer entry is not an optimiser state (param_groups and state)")
    numbers = []
    for group in groups:
        params = group.get("params") if isinstance(group, dict) else None
        if not isinstance(params, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                   for i in params):
            raise UserError(f"{path}: an optimiser parameter group does not list parameter numbers")
        numbers += params
    if len(set(numbers)) != len(numbers) or not all(k in set(numbers) and isinstance(v, dict)
                                                    for k, v in per_param.items()):
        raise UserError(f"{path}: its optimiser state names parameters its groups do not list once")


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (nested lists and dictionaries)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def check_model_state(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor], source: str) -> None:
    """A :class:`UserError` naming the first parameter or buffer of ``tensors`` that ``model`` does
    not have, lacks, or has with another shape: checked before ``load_state_dict`` copies anything."""
    expected = model.state_dict()
    for name, tensor in tensors.items():
        if name not in expected:
            raise UserError(f"{source}: has a tensor '{name}' that the model built from the run's settings "
                            "does not have")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise UserError(f"{source}: '{name}' has shape {tuple(tensor.shape)}, the model built from the "
                            f"run's settings needs {tuple(expected[name].shape)}")
    missing = [name for name in expected if name not in tensors]
    if missing:
        raise UserError(f"{source}: lacks '{missing[0]}' of the model built from the run's settings"
                        + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""))


def load_model_state(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor], path: Path,
                     code_version: str = "?") -> None:
    """Load a checkpoint's ``model`` tensors into ``model`` after :func:`check_model_state`; what still does
    not fit is one line naming ``path`` and the code that trained it."""
    check_model_state(model, tensors, str(path))
    try:
        model.load_state_dict(tensors)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
        raise UserError(f"{path} does not fit the model this code builds "
                        f"(trained with code {code_version}): {first}") from None


def check_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any], source: str) -> None:
    """A :class:`UserError` unless ``state`` (an optimiser ``state_dict``) has ``optimizer``'s parameter
    groups and, for each parameter, per-parameter tensors of that parameter's shape (0-d ones, such
    as Adam's step, aside)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    groups = state.get("param_groups") if isinstance(state, Mapping) else None
    per_param = state.get("state") if isinstance(state, Mapping) else None
    if not isinstance(groups, list) or not isinstance(per_param, dict):
        raise UserError(f"{source}: its optimizer entry is not an optimiser state")
    sizes = [len(g.get("params", ())) if isinstance(g, dict) else -1 for g in groups]
    if sizes != [len(g["params"]) for g in optimizer.param_groups]:
        raise UserError(f"{source}: its optimiser has parameter groups of sizes {sizes}, this model "
                        f"{[len(g['params']) for g in optimizer.param_groups]}")
    for index, values in per_param.items():
        if not isinstance(index, int) or not 0 <= index < len(params) or not isinstance(values, dict):
            raise UserError(f"{source}: its optimiser state names parameter {index!r}, which this model "
                            "lacks")
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != params[index].shape:
                raise UserError(f"{source}: optimiser '{key}' of parameter {index} has shape "
                                f"{tuple(value.shape)}, the parameter {tuple(params[index].shape)}")


def newest_checkpoint(folder: str | os.PathLike, names: tuple[str, ...] = (LAST, BEST)
                      ) -> tuple[Path, dict[str, Any]] | None:
    """The furthest-advanced of the checkpoints ``names`` in ``folder``: ``(path, state)``, or None.

    Every checkpoint of a run lies on the one deterministic path of that run, so the one with the
    most steps done is where a resume continues from (ties go to the earlier name: ``last.pt``).
    ``best.pt`` is written just before ``last.pt`` at the end of an epoch, so a run killed during that
    second write (its first ``last.pt``, or a later one) resumes from ``best.pt``. A checkpoint that is
    present but cannot be read safely is an error, never skipped.
    """
    found: list[tuple[tuple[int, int, int], Path]] = []
    for rank, name in enumerate(names):
        path = Path(folder) / name
        if path.is_file():
            state = load_checkpoint(path, mmap=True)  # every candidate checked; tensors only mapped
            found.append(((int(state.get("global_step", 0)), int(state["epoch"]), -rank), path))
            del state
    if not found:
        return None
    _, path = max(found, key=lambda item: item[0])
    return path, load_checkpoint(path, map_location="cpu")


def remove_stale_temporaries(folder: str | os.PathLike) -> int:
    """Delete temporary files left by a writer killed mid-write; returns how many were removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    n = 0
    for tmp in folder.glob(".*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
            n += 1
    return n


# -- the one-time conversion of older checkpoints ----------------------------------------------------
def convert_checkpoint(path: str | os.PathLike) -> bool:
    """Re-save a checkpoint written before format 2 in format 2; ``False`` if it already is one.

    This unpickles the file (``weights_only=False``), which runs any code a pickled object in it
    carries: call it only on checkpoints one wrote oneself or trusts. The converted file is checked
    to load with the safe loader before it replaces the original (atomically).
    """
    path = Path(path)
    try:
        load_checkpoint(path)
        return False
    except UserError:
        pass
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise UserError(f"{path}: cannot read it even with pickle ({type(exc).__name__}: {_first_line(exc)})"
                        ) from None
    if not isinstance(state, dict) or "model" not in state or "epoch" not in state:
        raise UserError(f"{path}: not a training checkpoint of this toolkit (no model and epoch entries)")
    state = dict(state)
    if isinstance(state.get("rng"), Mapping) and isinstance(state["rng"].get("numpy"), tuple):
        state["rng"] = _plain_rng(state["rng"])
    if isinstance(state.get("model"), Mapping):
        state["model"] = dict(state["model"])
    try:
        check_plain(state)
    except TypeError as exc:
        raise UserError(f"{path}: cannot convert it: {exc}") from None
    save_checkpoint(path, state)
    load_checkpoint(path)
    return True
