"""Integrity of a feature store's finished blocks: ``features verify`` and the check made on resume.

A block flagged done promises that its rows are on disk. Two depths check that promise:

- **files** (:func:`check_files`; every ``features cnn|fne|regions`` that resumes a store runs it):
  for every block flagged done, the chunk file of each per-block array (``imgid``, ``valid``,
  ``failures`` and the extracted rows, ``global``, ``fne/raw`` or the region arrays) exists, is a
  regular file (not a folder in its place: Zarr would read either as NaN rows) and is not empty
  (:func:`features.store.array.chunk_file_problem`, the readers' rule). Only ``stat`` calls, a few per
  block, no data read: cheap even for a 34 GB FNE store.
- **values** (:func:`verify_store`, ``features verify``): also decodes every chunk of those blocks
  (and of ``fne/ternary``, ``fne/mean``, ``fne/std`` of a finished FNE store), checks that valid
  rows are finite, ternary values are in {-1, 0, 1}, ``imgid`` is the row, region ``counts`` are
  ``1..k`` with zero rows after them, and that ``valid`` is
  False exactly at the images the block's ``failures`` record (imported stores: at least there,
  since rows of splits never imported are invalid without a failure). This reads the whole store.
  For a finished FNE store it also checks that the thresholds the ternary array records are finite with
  low < high, recomputes the ternary code of a few valid rows of each block (:data:`SAMPLE_ROWS`) from
  ``fne/raw``, the statistics and those thresholds, and, when the prepared dataset is known (``--data``,
  or the one the provenance names, if unchanged), the train statistics of the first
  :data:`SAMPLE_COLUMNS` features.

``--repair`` clears the completion flag of each damaged block (the next ``features cnn|fne|regions``
recomputes it) and marks the store incomplete; damage confined to the arrays derived at the end
(``fne/ternary``, ``fne/mean``, ``fne/std``) only marks the store incomplete, so that the next run
derives them again without re-extracting. The times of both depths are printed by
``bench/bench_features.py --verify-rows N``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from features.store.array import MISSING, chunk_file_problem
from features.store.core import TERNARY, FeatureStore
from features.store.read import check_store_matches
from prep.dataset import PreparedDataset
from vsecore.errors import UserError
from vsecore.io import exclusive_lock
from vsecore.jsonfile import parse_json

#: arrays derived from fne/raw after all blocks are in (damage there needs no re-extraction)
DERIVED = (TERNARY, "fne/mean", "fne/std")


@dataclass
class VerifyReport:
    """What :func:`verify_store` found: damaged blocks (block -> problems) and store-level problems."""

    store: Path
    n_blocks: int
    done: int
    complete: bool
    blocks: dict[int, list[str]] = field(default_factory=dict)
    rows_damaged: set[int] = field(default_factory=set)
    store_problems: list[str] = field(default_factory=list)
    repaired: bool = False
    #: the images the finished blocks record as failed (imgid, path, reason)
    failures: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No damage found and the store finished."""
        return not self.blocks and not self.store_problems and self.complete

    def lines(self, limit: int = 20) -> list[str]:
        """The summary line, then one line per damaged block (at most ``limit``) and store problem."""
        out = [f"features verify: {self.store}: {self.done}/{self.n_blocks} blocks done, "
               f"{len(self.blocks)} damaged, {'complete' if self.complete else 'incomplete'}"]
        for b in sorted(self.blocks)[:limit]:
            out.append(f"  block {b}: {'; '.join(self.blocks[b])}")
        if len(self.blocks) > limit:
            out.append(f"  ... and {len(self.blocks) - limit} more damaged blocks")
        out.extend(f"  {p}" for p in self.store_problems)
        if self.failures:
            from features.extractors.images import is_transient

            transient = sum(is_transient(f.get("reason", "")) for f in self.failures)
            again = (f"; {transient} may be transient (missing file, I/O error, truncated file): the store's "
                     "command retries them when run again" if transient else "")
            out.append(f"  {len(self.failures)} image(s) recorded as failed (rows invalid){again}")
            out.extend(f"  failed imgid {f.get('imgid')}: {f.get('path')}: {f.get('reason')}"
                       for f in self.failures[:limit])
            if len(self.failures) > limit:
                out.append(f"  ... and {len(self.failures) - limit} more failed images")
        return out


def row_arrays(store: FeatureStore) -> list[str]:
    """The arrays every block writes: ``imgid``, ``valid``, ``failures`` and the extracted outputs."""
    return ["imgid", "valid", "failures", *store.attrs.get("outputs", {})]


def check_files(store: FeatureStore, names: list[str] | None = None,
                blocks: list[int] | None = None) -> dict[int, list[str]]:
    """Blocks flagged done (or ``blocks``) with a chunk file that is missing, not a regular file (a folder
    in its place) or empty: block -> problems.

    ``stat`` only. Stores written before every chunk was written (no ``empty_chunks_written``
    attribute) legitimately lack the ``failures`` chunk of a block without failures.
    """
    legacy = not store.attrs.get("empty_chunks_written")
    if blocks is None:
        blocks = [int(b) for b in np.flatnonzero(_flags(store)[0])]
    problems: dict[int, list[str]] = {}
    for name in names or row_arrays(store):
        for b, files in store.array(name).chunk_files(blocks).items():
            for file in files:
                problem = chunk_file_problem(file, required=not (legacy and name == "failures"))
                if problem is None and file.is_file() and file.stat().st_size == 0:
                    problem = "empty"
                if problem is not None:
                    sep = " " if problem in (MISSING, "empty") else ": "
                    problems.setdefault(b, []).append(f"{_rel(store, file)}{sep}{problem}")
    return problems


def _rel(store: FeatureStore, file: Path) -> str:
    return os.path.relpath(file, store.path)


def _flags(store: FeatureStore) -> tuple[np.ndarray, dict[int, str]]:
    """Completion flags, reading a damaged ``blocks_done`` chunk as "not done" (and reporting it)."""
    arr = store.array("blocks_done")
    try:
        return np.asarray(arr[:], dtype=bool), {}
    except UserError:
        flags, bad = np.zeros(store.n_blocks, dtype=bool), {}
        for b in range(store.n_blocks):
            try:
                flags[b] = bool(arr[b])
            except UserError:
                bad[b] = f"blocks_done/{arr.chunk_key((b,))} unreadable"
        return flags, bad


#: valid rows of each block whose ternary code ``features verify`` recomputes from ``fne/raw``
SAMPLE_ROWS = 4
#: FNE columns whose train statistics ``features verify`` recomputes (one column chunk is read)
SAMPLE_COLUMNS = 64


@dataclass
class TernaryRecipe:
    """What a finished FNE store's ternary code is derived from: ``fne/mean`` (F,), ``fne/std`` (F,) and
    the thresholds the ternary array records."""

    mean: np.ndarray
    std: np.ndarray
    low: float
    high: float


def _check_values(store: FeatureStore, block: int, outputs: list[str], ternary: bool,
                  imported: bool, recipe: TernaryRecipe | None = None) -> tuple[list[str], bool]:
    """Decode one block's rows and check them; returns the problems and whether rows are damaged.

    ``recipe``: also recompute the ternary code of up to :data:`SAMPLE_ROWS` valid rows from ``fne/raw``.
    """
    start, stop = store.block_rows(block)
    problems: list[str] = []
    rows_damaged = False

    def read(name: str) -> np.ndarray | None:
        arr = store.array(name)
        try:
            return np.asarray(arr[start:stop] if name != "failures" else arr[block])
        except UserError:
            found = arr.damaged_chunk(start, stop) if name != "failures" else None
            problems.append(f"{found[0]} unreadable ({found[3]})" if found else f"{name} unreadable")
            return None

    imgid = read("imgid")
    if imgid is not None and not np.array_equal(imgid, np.arange(start, stop)):
        problems.append("imgid is not the row number")
    valid = read("valid")
    text = read("failures")
    failed: set[int] | None = None
    if text is not None:
        try:
            failed = {int(f["imgid"]) for f in parse_json(str(text), "failures")} if str(text) else set()
        except (UserError, ValueError, TypeError, KeyError):
            problems.append("failures record is not valid JSON")
    if valid is not None and failed is not None:
        wrongly_valid = [i for i in sorted(failed) if start <= i < stop and valid[i - start]]
        if wrongly_valid:
            problems.append(f"imgid {_few(wrongly_valid)} recorded as failed but marked valid")
        if not imported:
            unexplained = [start + int(k) for k in np.flatnonzero(~valid) if start + int(k) not in failed]
            if unexplained:
                problems.append(f"imgid {_few(unexplained)} invalid without a recorded failure")
    rows = {}
    for name in outputs:
        x = rows[name] = read(name)
        if x is not None and valid is not None:
            bad = np.flatnonzero(valid & ~np.isfinite(x.reshape(len(x), -1)).all(axis=1))
            if len(bad):
                problems.append(f"{name}: valid rows {_few([start + int(k) for k in bad])} not finite")
    if valid is not None and rows.get("regions") is not None and rows.get("counts") is not None:
        problems += _check_counts(rows["regions"], rows["counts"], valid, start)
    rows_damaged = bool(problems)
    if ternary:
        t = read(TERNARY)
        if t is not None and not np.isin(t, (-1, 0, 1)).all():
            problems.append(f"{TERNARY}: values outside {{-1, 0, 1}}")
        elif t is not None and recipe is not None and rows.get("fne/raw") is not None and valid is not None:
            problems += _check_ternary_sample(rows["fne/raw"], t, valid, start, recipe)
    return problems, rows_damaged


def _check_ternary_sample(raw: np.ndarray, ternary: np.ndarray, valid: np.ndarray, start: int,
                          recipe: TernaryRecipe) -> list[str]:
    """Recompute the ternary code of a block's first valid rows (``raw`` (B, F) float32, ``ternary``
    (B, F) int8) and name the rows that differ from the stored code."""
    from features.store.ternary import ternarize

    rows = np.flatnonzero(valid)[:SAMPLE_ROWS]
    if not len(rows):
        return []
    fresh = ternarize(raw[rows], recipe.mean, recipe.std, recipe.low, recipe.high)
    differ = [start + int(r) for r, same in zip(rows, (fresh == ternary[rows]).all(axis=1), strict=True)
              if not same]
    if not differ:
        return []
    return [f"{TERNARY}: rows {_few(differ)} differ from fne/raw with the recorded statistics and "
            f"thresholds {recipe.low} / {recipe.high}"]


def _recorded_failures(store: FeatureStore, blocks: list[int]) -> list[dict]:
    """The failure records of ``blocks`` (unreadable or malformed records are reported with their block)."""
    arr = store.array("failures")
    out: list[dict] = []
    for b in blocks:
        try:
            text = str(arr[b])
            out.extend(parse_json(text, "failures") if text else [])
        except (UserError, ValueError, TypeError):
            continue
    return [f for f in out if isinstance(f, dict)]


def _check_counts(regions: np.ndarray, counts: np.ndarray, valid: np.ndarray, start: int) -> list[str]:
    """A region block's ``counts`` (B,) against its ``regions`` (B, k, D): a valid row has 1..k regions
    and zero rows after them (the padding the encoders mask)."""
    k = regions.shape[1]
    problems = []
    wrong = np.flatnonzero(valid & ((counts < 1) | (counts > k)))
    if len(wrong):
        problems.append(f"counts: valid rows {_few([start + int(i) for i in wrong])} outside 1..{k}")
    padding = np.arange(k)[None, :] >= counts[:, None]  # (B, k)
    filled = (np.nan_to_num(regions) != 0).reshape(len(regions), k, -1).any(axis=2) & padding
    unpadded = np.flatnonzero(valid & filled.any(axis=1))
    if len(unpadded):
        problems.append(f"regions: rows {_few([start + int(i) for i in unpadded])} hold non-zero "
                        "regions after their counts")
    return problems


def _few(ids: list[int], limit: int = 5) -> str:
    head = ", ".join(str(i) for i in ids[:limit])
    return head + (f" (+{len(ids) - limit} more)" if len(ids) > limit else "")


def _check_statistics(store: FeatureStore) -> list[str]:
    problems = []
    for name in ("fne/mean", "fne/std"):
        if not store.has(name):
            problems.append(f"{name} missing")
            continue
        try:
            values = np.asarray(store.array(name)[:])
        except UserError:
            problems.append(f"{name} unreadable")
            continue
        if not np.isfinite(values).all() or (name == "fne/std" and (values < 0).any()):
            problems.append(f"{name} holds non-finite or negative values")
    return problems


def _ternary_recipe(store: FeatureStore, problems: list[str]) -> TernaryRecipe | None:
    """The statistics and thresholds of a finished FNE store's ternary code; ``None`` (and a problem
    appended) when the recorded thresholds are not two finite numbers with low < high."""
    from features.store.ternary import check_thresholds

    recorded = store.array(TERNARY).attrs.get("thresholds") or store.attrs.get("config", {}).get("thresholds")
    try:
        low, high = (float(t) for t in recorded)
        check_thresholds(low, high)
        mean = np.asarray(store.array("fne/mean")[:], dtype=np.float32)
        std = np.asarray(store.array("fne/std")[:], dtype=np.float32)
    except (TypeError, ValueError) as exc:
        problems.append(f"{TERNARY}: recorded thresholds {recorded!r} are unusable ({exc}); rethreshold the "
                        "store with finite values")
        return None
    except UserError:
        return None  # reported by _check_statistics
    return TernaryRecipe(mean, std, low, high)


def _recorded_dataset(store: FeatureStore) -> PreparedDataset | None:
    """The prepared dataset the store's provenance names, if it is still there and still its dataset."""
    recorded = store.attrs.get("provenance", {}).get("dataset")
    if not recorded:
        return None
    try:
        dataset = PreparedDataset.load(recorded)
        check_store_matches(store, dataset)
    except (UserError, OSError, ValueError):
        return None
    return dataset


def _check_statistics_sample(store: FeatureStore, dataset: PreparedDataset, recipe: TernaryRecipe
                             ) -> list[str]:
    """Recompute ``fne/mean`` and ``fne/std`` of the first :data:`SAMPLE_COLUMNS` features from the valid
    train rows of ``fne/raw`` (``dataset`` gives the splits) and report a difference."""
    from features.store.ternary import fne_statistics

    train = dataset.split_mask("train")
    rows = train & np.asarray(store.array("valid")[:], dtype=bool)
    width = min(SAMPLE_COLUMNS, recipe.mean.shape[0])
    if not rows.any() or len(rows) != store.n_rows:
        return []
    try:
        raw = np.asarray(store.array("fne/raw")[:, :width])
    except UserError:
        return []  # the damaged chunk is reported with its block
    mean, std = fne_statistics(raw, rows)
    bad = ~(np.isclose(mean, recipe.mean[:width], rtol=1e-4, atol=1e-5)
            & np.isclose(std, recipe.std[:width], rtol=1e-4, atol=1e-5))
    if not bad.any():
        return []
    first = int(np.flatnonzero(bad)[0])
    return [f"fne/mean, fne/std: feature {first} (and {int(bad.sum()) - 1} more of the first {width}) differ "
            f"from the train rows of fne/raw (recomputed {mean[first]:.6g} / {std[first]:.6g}, stored "
            f"{recipe.mean[first]:.6g} / {recipe.std[first]:.6g})"]


def verify_store(path: str | os.PathLike, data: str | os.PathLike | None = None, repair: bool = False
                 ) -> VerifyReport:
    """Check every finished block of the store at ``path`` (files and values; see the module doc).

    ``data``: also check that the store belongs to that prepared dataset. ``repair`` (under the
    store's writer lock) clears the flags of damaged blocks and marks the store incomplete, after
    finishing any ``--rethreshold`` a kill interrupted.
    """
    path = Path(path)
    if not repair:
        return _verify(FeatureStore(path), data)
    with exclusive_lock(path, "the feature store"):
        store = FeatureStore(path, mode="r+")
        store.recover()
        report = _verify(store, data)
        rows = sorted(report.rows_damaged)
        if rows:
            store.clear_blocks(rows)
        if report.blocks or report.store_problems:
            store.set_attrs(complete=False)
            report.repaired = True
        return report


def _verify(store: FeatureStore, data: str | os.PathLike | None) -> VerifyReport:
    """Check the store (see :func:`verify_store`); a writer that changed it meanwhile is a UserError."""
    before = store.state()
    report = _check_store(store, data)
    if store.state().generation != before.generation:
        raise UserError(f"{store.path}: the store was rewritten while it was being verified; run "
                        "`features verify` again when the writer has finished")
    return report


def _check_store(store: FeatureStore, data: str | os.PathLike | None) -> VerifyReport:
    dataset = None
    if data is not None:
        dataset = PreparedDataset.load(data)
        check_store_matches(store, dataset)
    attrs = store.attrs
    flags, bad_flags = _flags(store)
    complete = bool(attrs.get("complete")) and bool(flags.all())
    report = VerifyReport(store.path, store.n_blocks, int(flags.sum()), complete)
    for b, problem in bad_flags.items():
        report.blocks[b] = [problem]
        report.rows_damaged.add(b)
    outputs = [n for n in attrs.get("outputs", {}) if store.has(n)]
    report.store_problems += [f"array '{n}' missing" for n in attrs.get("outputs", {}) if n not in outputs]
    is_fne = "fne/raw" in outputs
    ternary = bool(attrs.get("complete")) and is_fne and store.has(TERNARY)
    if bool(attrs.get("complete")) and is_fne:
        if not store.has(TERNARY):
            report.store_problems.append(f"array '{TERNARY}' missing")
        report.store_problems += _check_statistics(store)
    recipe = None
    if ternary:
        recipe = _ternary_recipe(store, report.store_problems)
        dataset = dataset or _recorded_dataset(store)
        if recipe is not None and dataset is not None and not report.store_problems:
            report.store_problems += _check_statistics_sample(store, dataset, recipe)
    done = [int(b) for b in np.flatnonzero(flags)]
    report.failures = _recorded_failures(store, done)
    names = ["imgid", "valid", "failures", *outputs]
    files = check_files(store, names, done)
    derived = check_files(store, [TERNARY], done) if ternary else {}
    imported = attrs.get("config", {}).get("kind") == "import"
    for b in done:
        if b in files:
            report.blocks[b] = files[b] + derived.get(b, [])
            report.rows_damaged.add(b)
            continue
        problems, rows_damaged = _check_values(store, b, outputs, ternary, imported, recipe)
        problems = derived.get(b, []) + problems
        if problems:
            report.blocks[b] = problems
        if rows_damaged:
            report.rows_damaged.add(b)
    return report
