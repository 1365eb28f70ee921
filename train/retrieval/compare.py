"""``train compare``: several families trained on one prepared dataset and one store, side by side.

The table none of the papers could print: every family on the same data, the same image features and
the same evaluator. A comparison is a folder::

    OUT/compare.json           the plan, one row per run, one summary row per entry (mean and std over seeds)
    OUT/compare.md             the Markdown table (also printed)
    OUT/rsum_vs_parameters.png test rsum against parameters (log scale)
    OUT/noise_r1.png           R@1 both ways against the share of caption characters replaced (0 .. 25%)
    OUT/runs/ENTRY-seedS/      ordinary run directories (``train <family>`` writes them)

An *entry* is a family name (trained with its family's defaults) or the name of a pipeline of
``pipelines.yaml`` (trained with that pipeline's ``train`` settings); either way the dataset, the store,
the seed and (with ``--epochs``) the epochs are the comparison's. Families whose image side reads regions
(``clmr``, ``liwe``) read ``--regions`` instead of ``--features``: one store per kind of image input.

Runs are ordinary run directories, so ``train report``, ``train evaluate`` and the lock of each run apply
to them. A killed comparison re-run with the same command skips the finished runs, resumes the run it was
in from its newest checkpoint (a run killed before its first checkpoint starts over) and goes on.

After training, each run's best checkpoint is evaluated on the test split through ``train evaluate``
(:func:`train.retrieval.evaluate.run.evaluate_run`): protocol ``all`` on a small test split, ``5cv`` (COCO-1k,
5 folds) and ``5k`` on a test split of 5,000 images or more, and the CHAIN-VSE noise analysis (character
noise, :mod:`train.retrieval.evaluate.analysis`) at every ratio of ``--noise``. What the table reports is
only what the comparison computed itself, kept in the run's ``eval/compare_test.json`` with the SHA-256,
epoch and step of the checkpoint it came from, and computed again when that checkpoint (or the protocols,
or the noise ratios) changed: an ``eval/noise_test.json`` someone made by hand from another checkpoint is
never reported. ``--runs RUN...`` collects finished runs instead of training (evaluated the same way).
A stopped comparison has no ``--resume``: the same command resumes it.

Columns: *parameters* is the run's total parameter count; *train time* the sum of its epochs' time
(training and the per-epoch validation); *captions/s* the training captions per second of training time;
*epochs (best)* the epochs trained and the epoch of the best validation rsum. With ``--seeds K`` every
number of an entry is the mean +- the sample standard deviation over its K runs.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prep.dataset import PreparedDataset
from train.config.run import read_config
from train.config.sections import train_values
from train.engine.plots import plot_noise_by_family, plot_parameters_vs_rsum
from train.engine.settings import CompareSection
from train.models.family import family_names, model_spec, train_settings, with_family_defaults
from train.retrieval.evaluate.run import evaluate_run
from train.retrieval.fit import dataset_name, run_training
from train.retrieval.report import read_history, run_summary
from train.run.checkpoint import load_checkpoint
from train.run.layout import COMPARE_EVAL, RunDir, evaluation_name, noise_name
from vsecore import console
from vsecore.errors import UserError
from vsecore.io import atomic_file, sha256_file, write_json_atomic
from vsecore.jsonfile import read_json
from vsecore.outputs import check_output_folder
from vsecore.pipelines_file import PipelinesFile

#: the files a comparison writes into its folder (its runs go under ``runs/``)
COMPARE_JSON = "compare.json"
COMPARE_MD = "compare.md"
RSUM_PLOT = "rsum_vs_parameters.png"
NOISE_PLOT = "noise_r1.png"
RUNS = "runs"
OUTPUT_NAMES = (COMPARE_JSON, COMPARE_MD, RSUM_PLOT, NOISE_PLOT)
#: what compare.json says it is (a folder holding another compare.json is not replaced)
KIND = "vse-compare"
#: what resumes a stopped comparison (it has no --resume: it resumes from its own folder)
RESUME_COMPARE = "re-run the same command (train compare, or train pipeline) to resume it"
#: what compare_test.json says it is
COMPARE_EVAL_KIND = "vse-compare-evaluation"
#: what a run's test evaluation is, in the messages of its reader
TEST_EVALUATION = "a test evaluation"
#: the noise ratios of the robustness figure: 5% steps up to 25%
DEFAULT_NOISE: str = CompareSection.model_fields["noise"].default
#: ``--out`` of ``train compare`` without one
COMPARE_OUT = "runs/compare"
#: test splits at least this large are evaluated as COCO-5k: 1k 5-fold and the full set
FIVE_K = 5000
#: numbers averaged over seeds (keys of a run's row)
NUMBERS = ("parameters", "train_time_s", "captions_per_s", "epochs", "best_epoch", "i2t_r1", "i2t_r5",
           "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum", "rsum_5k")


@dataclass(frozen=True)
class Entry:
    """One row of the comparison: a family with its defaults, or a pipeline's train settings.

    ``values``: the train settings that the entry fixes (a pipeline's ``train`` section as written; for
    a family only ``family``); the comparison adds data, features, seed, epochs and ``out``.
    """

    name: str
    family: str
    variant: str
    values: dict[str, Any] = field(default_factory=dict)


def parse_entries(spec: str | None, pipelines_file: str | Path | None = None) -> list[Entry]:
    """``--families chain,oecc,coco-sample-seam`` -> entries: a registered family, or a pipeline name;
    ``None``: every registered family."""
    families = family_names()
    names = [n.strip() for n in spec.split(",") if n.strip()] if spec is not None else list(families)
    if not names:
        raise UserError("--families: give at least one family or pipeline name")
    if len(set(names)) != len(names):
        raise UserError(f"--families {spec}: a name is given twice")
    entries = []
    for name in names:
        if name in families:
            entries.append(Entry(name, name, "defaults", {"family": name}))
            continue
        pipelines = PipelinesFile.read(pipelines_file)
        if name not in pipelines.names():
            raise UserError(f"--families: '{name}' is neither a family ({', '.join(families)}) nor a "
                            f"pipeline of {pipelines_file or 'pipelines.yaml'}")
        entry = pipelines.entry(name, strict=False)  # its paths are the plan's: no variable needed
        if not entry.has("train"):
            raise UserError(f"--families: pipeline '{name}' has no train section")
        values = {k: v for k, v in train_values(entry).items() if k not in ("data", "features", "out")}
        entries.append(Entry(name, values["family"], f"pipeline {name}", values))
    return entries


def needs_regions(values: dict[str, Any], dataset_name: str | None) -> bool:
    """Whether the family of ``values`` (train settings) reads region features (its image side is not
    ``linear``), with the family's defaults for the dataset ``dataset_name`` (``coco``, ...) applied."""
    probe = train_settings(**{"out": "-", **values})
    return model_spec(with_family_defaults(probe, dataset_name)).image_encoder != "linear"


@dataclass(frozen=True)
class Plan:
    """What a comparison trains: entries x seeds on one dataset and one store per kind of image input."""

    data: str
    features: str | None
    regions: str | None
    entries: list[Entry]
    seeds: list[int]
    epochs: int | None
    out: str
    device: str = "auto"
    noise: str = DEFAULT_NOISE

    @functools.cached_property
    def dataset_name(self) -> str | None:
        """The prepared dataset's ``dataset`` field, read once (its ``dataset.json`` can be large)."""
        return dataset_name(self.data)

    def run_dir(self, entry: Entry, seed: int) -> Path:
        """``OUT/runs/ENTRY-seedS``."""
        return Path(self.out) / RUNS / f"{entry.name}-seed{seed}"

    def settings(self, entry: Entry, seed: int) -> Any:
        """The train settings of one run: the entry's values, the comparison's data, store, seed, epochs."""
        values = {**entry.values, "data": self.data, "seed": seed, "out": str(self.run_dir(entry, seed)),
                  "device": self.device}
        if self.epochs is not None:
            values["epochs"] = self.epochs
        values["features"] = self.regions if needs_regions(values, self.dataset_name) else self.features
        return train_settings(**values)

    def describe(self) -> dict[str, Any]:
        """The plan as compare.json records it."""
        return {"data": self.data, "features": self.features, "regions": self.regions,
                "entries": [{"name": e.name, "family": e.family, "variant": e.variant} for e in self.entries],
                "seeds": self.seeds, "epochs": self.epochs, "noise": self.noise}


def plan_from_section(section: CompareSection, pipelines_file: str | Path | None = None) -> Plan:
    """The plan of a ``compare`` section (the pipeline stage, or ``train compare``'s options): its entries
    parsed from ``families`` (pipeline names looked up in ``pipelines_file``), seeds
    ``seed..seed+seeds-1``."""
    spec = ",".join(section.families) if section.families is not None else None
    return Plan(data=section.data, features=section.features, regions=section.regions,
                entries=parse_entries(spec, pipelines_file),
                seeds=[section.seed + k for k in range(section.seeds)], epochs=section.epochs,
                out=section.out,
                device=section.device, noise=section.noise)


def check_plan(plan: Plan, overwrite: bool = False) -> None:
    """One-line errors before anything is trained: a missing store for a family, an output folder that
    is an input or lies inside an artifact, a folder holding compare outputs it did not write
    (:func:`check_compare_out`)."""
    for entry in plan.entries:
        regions = needs_regions({**entry.values, "data": plan.data}, plan.dataset_name)
        if regions and not plan.regions:
            raise UserError(f"{entry.name}: this family reads region features: give --regions STORE:regions")
        if not regions and not plan.features:
            raise UserError(f"{entry.name}: this family reads global features: give --features STORE:global")
    inputs = [plan.data, *(s.rsplit(":", 1)[0] for s in (plan.features, plan.regions) if s)]
    check_compare_out(plan.out, inputs, overwrite)


def check_compare_out(out: str | Path, inputs: Sequence[str | Path], overwrite: bool = False) -> None:
    """``--out`` of a comparison: not an input nor inside another artifact (:mod:`vsecore.outputs`), and its
    compare.json, compare.md and figures replaced only when compare wrote them (a compare.json of its
    kind beside them) or with ``overwrite`` (the output rule of every writer, docs/safety.md)."""
    check_output_folder(out, [], inputs=inputs)
    own = Path(out) / COMPARE_JSON
    try:
        ours = own.is_file() and read_json(own, "a comparison's compare.json", kind=dict).get("kind") == KIND
    except UserError:
        ours = False
    found = [name for name in OUTPUT_NAMES if (Path(out) / name).exists()]
    if found and not ours and not overwrite:
        raise UserError(f"--out {out}: holds {', '.join(found)}, which train compare did not write; give the "
                        "comparison a folder of its own, or --overwrite to replace them")


def check_same_dataset(runs: Sequence[str]) -> None:
    """One-line errors for runs a table must not set side by side: one run given twice, or runs trained on
    different prepared datasets (their test splits differ: the numbers are not comparable)."""
    seen: dict[Path, str] = {}
    datasets: dict[str, str] = {}
    for run in runs:
        where = Path(run).resolve()
        if where in seen:
            raise UserError(f"--runs: {run} is given twice (as {seen[where]})")
        seen[where] = run
        config = read_config(run)
        data = (config.get("fingerprints") or {}).get("dataset_json") or str(config["settings"].get("data"))
        datasets.setdefault(data, run)
        if len(datasets) > 1:
            first = datasets[next(iter(datasets))]
            raise UserError(f"--runs: {run} was trained on another prepared dataset than {first} "
                            f"({config['settings'].get('data')}, dataset.json differs): their test numbers "
                            "are not comparable side by side")


def train_run(plan: Plan, entry: Entry, seed: int, log: Callable[[str], None] = console.info) -> Path:
    """Train one run of the plan, or resume it, or leave it (finished: its ``eval/test.json`` exists)."""
    run_dir = plan.run_dir(entry, seed)
    run = RunDir(run_dir)
    settings = plan.settings(entry, seed)
    if run.test_eval.is_file():
        log(f"[compare] {run_dir.name}: finished, kept")
        return run_dir
    resume = run.last.is_file() or run.best.is_file()
    overwrite = not resume and run.is_run()  # killed before its first checkpoint: start it over
    log(f"[compare] {run_dir.name}: {'resuming' if resume else 'training'} {entry.family} ({entry.variant})")
    try:
        return run_training(settings, resume=resume, overwrite=overwrite, log=log)
    except BaseException as exc:  # what the run kept, and what resumes it here (compare has no --resume)
        if getattr(exc, "vse_hint", None):
            exc.vse_hint = run.kept(RESUME_COMPARE)  # type: ignore[attr-defined]
        raise


def test_protocols(run_dir: Path) -> list[str]:
    """``all`` on a small test split; ``5cv`` and ``5k`` on a split of :data:`FIVE_K` images or more. The
    size is the one ``eval/test.json`` records (the dataset is read only for a run without it)."""
    test = RunDir(run_dir).test_eval
    images = read_json(test, TEST_EVALUATION, kind=dict).get("images") if test.is_file() else None
    if isinstance(images, int):
        n = images
    else:
        data = read_config(run_dir).get("settings", {}).get("data")
        n = len(PreparedDataset.load(data).images_of("test")) if data else 0
    return ["5cv", "5k"] if n >= FIVE_K else ["all"]


def checkpoint_identity(run_dir: Path) -> dict[str, Any]:
    """The best checkpoint a comparison reports: its SHA-256, epoch and step (what its evaluation records)."""
    best = RunDir(run_dir).best
    state = load_checkpoint(best, mmap=True)
    return {"checkpoint": "best", "sha256": sha256_file(best), "epoch": int(state["epoch"]),
            "global_step": int(state.get("global_step", 0))}


def evaluate_for_comparison(run_dir: Path, noise: str | None, device: str = "auto",
                            log: Callable[[str], None] = console.info) -> dict[str, Any]:
    """What the comparison reports of a run, computed by the comparison from the best checkpoint: the test
    protocols of :func:`test_protocols` and (``noise``: ratios) the noise analysis.

    Kept in ``eval/compare_test.json`` with the identity of that checkpoint (:func:`checkpoint_identity`)
    and reused only while the checkpoint, the protocols and the noise ratios are the same; files of
    ``eval/`` that compare did not write (``train evaluate`` run by hand, from another checkpoint or
    while the run trained) are never read. Returns ``{"checkpoint", "noise_spec", "protocols", "noise"}``.
    """
    run, identity, wanted = RunDir(run_dir), checkpoint_identity(run_dir), test_protocols(run_dir)
    record = run.eval_dir / COMPARE_EVAL
    if record.is_file():
        kept = read_json(record, "a comparison's evaluation (compare_test.json)", kind=dict)
        if (kept.get("checkpoint") == identity and set(wanted) <= set(kept.get("protocols") or {})
                and (noise is None or (kept.get("noise_spec") == noise and kept.get("noise")))):
            return kept
    with tempfile.TemporaryDirectory(prefix="vse-compare-") as tmp:
        folder = Path(tmp)

        def said(message: str) -> None:
            # what it wrote is copied into the run's eval/ below: no message names the temporary folder
            log(message.replace(str(folder), str(run.eval_dir)))

        evaluate_run(run_dir, "test", wanted, noise=noise, device=device, log=said, overwrite=True,
                     json_path=folder / evaluation_name("test", "best"), out_dir=folder)
        if checkpoint_identity(run_dir) != identity:
            raise UserError(f"{run.best}: changed while the comparison evaluated it; {RESUME_COMPARE}")
        protocols = read_json(folder / evaluation_name("test", "best"), TEST_EVALUATION, kind=dict)
        result = {"kind": COMPARE_EVAL_KIND, "checkpoint": identity, "noise_spec": noise,
                  "protocols": protocols,
                  "noise": (read_json(folder / noise_name("test"), "a noise analysis", kind=dict)
                            if noise is not None else None)}
        for name in (evaluation_name("test", "best"), noise_name("test"), noise_name("test", "png")):
            if (folder / name).is_file():  # what train evaluate would have written, for the user to see
                with atomic_file(run.eval_dir / name, "wb") as fh:
                    fh.write((folder / name).read_bytes())
    write_json_atomic(record, result)
    return result


def run_row(run_dir: Path, evaluation: dict[str, Any]) -> dict[str, Any]:
    """One run's numbers (see the module docstring) from its config and metrics and the comparison's own
    ``evaluation`` of its best checkpoint (:func:`evaluate_for_comparison`)."""
    summary = run_summary(run_dir)
    run = RunDir(run_dir)
    history = read_history(run.metrics) if run.metrics.is_file() else []
    train_s = sum(float(r.get("train_time_s", 0.0)) for r in history)
    captions = sum(int(r.get("captions", 0)) for r in history)
    protocols = evaluation.get("protocols") or {}
    main = protocols.get("5cv") or protocols.get("all")
    if not isinstance(main, dict):
        raise UserError(f"{run.eval_dir}: no test evaluation under protocol 'all' or '5cv' (train evaluate "
                        f"--run {run_dir} --protocol all)")
    row = {"run": str(run_dir), "name": run_dir.name, "family": summary["family"],
           "settings": summary["settings"], "parameters": summary["parameters"],
           "train_time_s": sum(float(r.get("time_s", 0.0)) for r in history),
           "captions_per_s": captions / train_s if train_s > 0 else 0.0,
           "epochs": summary["epochs"], "best_epoch": summary["best_epoch"],
           "protocol": "5cv" if "5cv" in protocols else "all", "rsum": float(main["rsum"]),
           "rsum_5k": float(protocols["5k"]["rsum"]) if "5k" in protocols else None}
    for d in ("i2t", "t2i"):
        for k in ("r1", "r5", "r10"):
            row[f"{d}_{k}"] = float(main[d][k])
    row["noise"] = evaluation.get("noise")
    row["checkpoint"] = evaluation.get("checkpoint")
    return row


def summarise(entry: Entry, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """An entry's summary row: each number of :data:`NUMBERS` as its mean (``x``) and, with several
    seeds, its sample standard deviation (``x_std``); the noise curve as the mean R@1 per ratio."""
    out: dict[str, Any] = {"name": entry.name, "family": entry.family, "variant": entry.variant,
                           "seeds": len(rows), "protocol": rows[0]["protocol"]}
    for key in NUMBERS:
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        if not values:
            out[key] = None
            continue
        out[key] = statistics.fmean(values)
        out[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else None
    out["noise"] = _mean_noise([r["noise"] for r in rows if r.get("noise")])
    return out


def _mean_noise(curves: list[dict[str, Any]]) -> dict[str, list[float]] | None:
    """Noise curves of several seeds -> their means: ``{"ratio": [0, r1, ...], "i2t_r1": [...],
    "t2i_r1": [...]}``."""
    if not curves:
        return None
    ratios = [0.0] + [float(p["ratio"]) for p in curves[0]["ratios"]]
    result: dict[str, list[float]] = {"ratio": ratios}
    for d in ("i2t", "t2i"):
        per_seed = [[c["clean"][d]["r1"]] + [p[d]["r1"] for p in c["ratios"]] for c in curves
                    if len(c["ratios"]) == len(ratios) - 1]
        result[f"{d}_r1"] = [statistics.fmean(v) for v in zip(*per_seed, strict=True)]
    return result


# --------------------------------------------------------------------------- the table


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    std = row.get(f"{key}_std")
    return format(value, fmt) + (f" ± {format(std, fmt)}" if std is not None else "")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, s = divmod(int(round(seconds)), 60)
    return f"{minutes} min {s:02d} s" if minutes else f"{s} s"


def format_table(summary: Sequence[dict[str, Any]]) -> str:
    """The Markdown table of the summary rows (:func:`summarise`): one line per entry.

    R@k and rsum are of the test split's main protocol (``all``, or COCO-1k 5-fold ``5cv``); a test split
    of 5,000 images or more also gets the full-set (``5k``) rsum.
    """
    five_k = any(r.get("rsum_5k") is not None for r in summary)
    protocol = "COCO-1k 5-fold" if any(r["protocol"] == "5cv" for r in summary) else "test split"
    head = ["family", "variant", "parameters", "train time", "captions/s", "epochs (best)",
            "i2t R@1", "R@5", "R@10", "t2i R@1", "R@5", "R@10", f"rsum ({protocol})"]
    head += ["rsum (5k)"] if five_k else []
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in summary:
        epochs = f"{_cell(r, 'epochs', '.0f')} ({_cell(r, 'best_epoch', '.0f')})"
        time_s = _duration(r["train_time_s"]) + (f" ± {_duration(r['train_time_s_std'])}"
                                                 if r.get("train_time_s_std") is not None else "")
        cells = [r["family"], r["variant"], f"{r['parameters']:,.0f}", time_s,
                 _cell(r, "captions_per_s", ".0f"), epochs]
        cells += [_cell(r, f"{d}_{k}", ".1f") for d in ("i2t", "t2i") for k in ("r1", "r5", "r10")]
        cells.append(_cell(r, "rsum", ".1f"))
        cells += [_cell(r, "rsum_5k", ".1f")] if five_k else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the command


def write_outputs(plan_record: dict[str, Any], rows: list[dict[str, Any]], summary: list[dict[str, Any]],
                  out: Path, wall_s: float | None, log: Callable[[str], None] = console.info) -> None:
    """compare.json, compare.md and the two figures into ``out``; the table is printed."""
    table = format_table(summary)
    console.result(table)
    write_json_atomic(out / COMPARE_JSON, {"kind": KIND, "plan": plan_record, "wall_s": wall_s,
                                           "summary": summary, "runs": rows})
    with atomic_file(out / COMPARE_MD, "w") as fh:
        fh.write(table + "\n")
    points = [{"name": r["name"], "family": r["family"], "parameters": r["parameters"], "rsum": r["rsum"]}
              for r in summary]
    plot_parameters_vs_rsum(points, out / RSUM_PLOT, title="test rsum against parameters")
    curves = [{"name": r["name"], **r["noise"]} for r in summary if r.get("noise")]
    if curves:
        plot_noise_by_family(curves, out / NOISE_PLOT)
    log(f"wrote {out / COMPARE_JSON}, {out / COMPARE_MD}, {out / RSUM_PLOT}"
        + (f" and {out / NOISE_PLOT}" if curves else ""))


def run_compare(plan: Plan, log: Callable[[str], None] = console.info, overwrite: bool = False
                ) -> list[dict[str, Any]]:
    """Train (or resume, or keep) every run of ``plan``, evaluate each, and write the comparison
    (``overwrite``: also over compare outputs in ``plan.out`` that compare did not write).

    Returns the summary rows, one per entry."""
    check_plan(plan, overwrite)
    out = Path(plan.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows, summary = [], []
    for entry in plan.entries:
        mine = []
        for seed in plan.seeds:
            run_dir = train_run(plan, entry, seed, log)
            with _resumable():
                mine.append(run_row(run_dir, evaluate_for_comparison(run_dir, plan.noise, plan.device, log)))
        rows += mine
        summary.append(summarise(entry, mine))
    wall = time.perf_counter() - t0
    log(f"[compare] {len(rows)} runs in {_duration(wall)} (this invocation)")
    write_outputs(plan.describe(), rows, summary, out, wall, log)
    return summary


@contextlib.contextmanager
def _resumable() -> Iterator[None]:
    """Ctrl-C (or a full disk) while a comparison evaluates says what resumes it."""
    try:
        yield
    except (KeyboardInterrupt, OSError) as exc:
        if getattr(exc, "vse_hint", None) is None:
            exc.vse_hint = f"the runs are kept: {RESUME_COMPARE}"  # type: ignore[attr-defined]
        raise


def collect_runs(runs: Sequence[str], out: str | None, noise: str | None, device: str = "auto",
                 log: Callable[[str], None] = console.info, overwrite: bool = False) -> list[dict[str, Any]]:
    """``--runs``: the comparison of finished run directories (one entry per run, named by its folder), each
    once and all of one prepared dataset (:func:`check_same_dataset`); ``out`` as in :func:`run_compare`."""
    check_same_dataset(runs)
    if out is not None:
        check_compare_out(out, runs, overwrite)
    rows, summary = [], []
    for run in runs:
        run_dir = Path(run)
        row = run_row(run_dir, evaluate_for_comparison(run_dir, noise, device, log))
        rows.append(row)
        summary.append(summarise(Entry(run_dir.name, row["family"], run_dir.name), [row]))
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        write_outputs({"runs": [str(r) for r in runs]}, rows, summary, Path(out), None, log)
    else:
        console.result(format_table(summary))
    return summary
