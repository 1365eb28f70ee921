"""``train evaluate``: retrieval metrics of a trained run, of saved embeddings or of a similarity matrix.

Three sources:

* ``--run RUN_DIR``: embeds a split with the run's model (best or last checkpoint) and evaluates
  it with the run's similarity; ``--noise`` and ``--length-analysis`` add the CHAIN-VSE analyses.
  JSON and PNG outputs go to ``RUN_DIR/eval/`` unless ``--out`` says otherwise.
* ``--img-emb IMG.npy --cap-emb CAP.npy``: embeddings saved by any codebase in the VSE++ layout
  (one image per row, ``--captions-per-image`` captions per image in image order; an image file
  with one row per caption, as VSE++ sometimes saves it, is reduced to every k-th row), or with any
  number of captions per image given by ``--caption-image CI.npy`` (the image row of each caption;
  ``X_caption_image.npy`` beside ``X_cap.npy``, as ``train export-embeddings`` writes them, is found
  by itself), so an export of a ragged split evaluates to the run's own numbers.
* ``--sims S.npy``: an (images, captions) similarity matrix computed by another codebase (e.g.
  SCAN's cross-attention scores), captions in the same layout; larger = more similar, no measure.
  It is memory-mapped and read tile by tile; ``--sims-transposed`` reads a (captions, images) file.

``--ranks OUT.csv`` writes one row per query (and ``--topk K`` its K best candidates), from the same
blocked pass (see :func:`train.retrieval.evaluate.tables.write_ranks_csv`). Every source is ranked, its
table printed and its files written by the one evaluation entry,
:func:`train.retrieval.evaluate.entry.evaluate_retrieval`; :func:`evaluate_run` is a run's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from train.retrieval.evaluate.analysis import (
    alphabet_from_chars_json,
    noise_robustness,
    parse_ratio_range,
    plot_noise,
)
from train.retrieval.evaluate.analysis import length_analysis as run_length_analysis
from train.retrieval.evaluate.entry import Embedded, Report, evaluate_retrieval
from train.retrieval.evaluate.gallery import write_gallery
from train.retrieval.evaluate.protocols import PROTOCOLS, ProtocolResult, protocol_folds
from train.retrieval.evaluate.ranking import Log
from train.retrieval.evaluate.tables import format_length_table, format_noise_table, protocol_label
from train.retrieval.loaded import Embeddings, LoadedRun, embed_split, encode_texts
from train.retrieval.open import load_run, run_inputs
from train.run.layout import RunDir, evaluation_name, length_name, noise_name
from vsecore import console
from vsecore.errors import UserError
from vsecore.io import write_json_atomic


def parse_protocols(values: Sequence[str] | None) -> list[str]:
    """``--protocol`` values (repeatable, each possibly a comma list) -> protocol names, in order."""
    names: list[str] = []
    for value in values or ["all"]:
        for name in value.split(","):
            name = name.strip()
            if not name:
                continue
            if name not in PROTOCOLS:
                raise UserError(f"--protocol {name!r}: expected one of {', '.join(PROTOCOLS)}")
            if name not in names:
                names.append(name)
    return names or ["all"]


def check_topk(topk: int | None, ranks_path: Path | None, gallery: bool = False) -> int:
    if topk is None:
        return 0
    if topk < 1:
        raise UserError(f"--topk must be at least 1, got {topk}")
    if ranks_path is None and not gallery:
        raise UserError("--topk K lists each query's K best candidates in the --ranks OUT.csv file or the "
                        "--gallery page: give one of them")
    return topk


def _split_images(run: object, split: str, lang: str | None = None) -> int:
    """Images of ``split`` with a caption in ``lang`` (default the run's), from the prepared dataset."""
    sentences = run.dataset.sentences_of(split, lang or run.settings.lang)  # type: ignore[attr-defined]
    return len({s.imgid for s in sentences})


def check_distinct(outputs: dict[str, Path | None]) -> None:
    """Refuse two outputs of one command that are the same file (the second would replace the first)."""
    seen: dict[Path, str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        key = Path(path).resolve()
        if key in seen:
            raise UserError(f"{option} {path}: is also the {seen[key]} output; give each output its own file")
        seen[key] = option


def run_outputs(run_dir: Path, split: str, checkpoint: str, lang: str | None, noise: bool,
                length_analysis: bool, json_path: Path | None, out_dir: Path | None,
                ranks_path: Path | None, gallery_path: Path | None) -> dict[str, Path | None]:
    """Every file :func:`evaluate_run` writes, by the option that names it (or the analysis)."""
    out = Path(out_dir) if out_dir is not None else RunDir(run_dir).eval_dir
    default_json = out / evaluation_name(split, checkpoint, lang)
    return {"--json": json_path or default_json, "--ranks": ranks_path, "--gallery": gallery_path,
            "--noise (JSON)": out / noise_name(split) if noise else None,
            "--noise (PNG)": out / noise_name(split, "png") if noise else None,
            "--length-analysis": out / length_name(split) if length_analysis else None}


def check_run_outputs(run_dir: Path, outputs: dict[str, Path | None], overwrite: bool,
                      defaults: Sequence[str] = ()) -> None:
    """The output-path rule for a reader of a run (:meth:`train.run.layout.RunDir.check_eval_output`):
    no input of the run, inside the run only its ``eval/`` folder, an existing file only with
    ``overwrite`` (the run's own eval files among the ``defaults`` outputs excepted), and no two
    outputs the same file."""
    run = RunDir(run_dir)
    inputs = run_inputs(run_dir)
    check_distinct(outputs)
    for option, path in outputs.items():
        if path is not None:
            run.check_eval_output(path, option=option.split(" ")[0], overwrite=overwrite, inputs=inputs,
                                  default=option in defaults)


def _noise_analysis(run: LoadedRun, emb: Embeddings, split: str, ratios: list[float], protocol: str,
                    noise_seed: int, fold_size: int, out: Path, log: Log) -> None:
    """The CHAIN-VSE noise-robustness analysis of an embedded split: the table, ``noise_{split}.json``
    and its plot in ``out``."""
    chars = Path(run.settings.data or "") / "chars.json"
    alphabet = alphabet_from_chars_json(chars) if chars.is_file() else None
    log(f"noise analysis: {len(ratios)} ratios, protocol {protocol_label(protocol)}, seed {noise_seed}, "
        f"alphabet {'from ' + str(chars) if alphabet else 'of the captions'}")
    result = noise_robustness(
        emb.images, emb.texts, emb.caption_image, lambda texts: encode_texts(run, texts),
        run.settings.measure, ratios, protocol, alphabet, noise_seed, bool(run.settings.order_sqrt),
        fold_size, run.device,
        progress=lambda r, m: log(f"  noise {100 * r:.1f}%: i2t R@1 {m.i2t.r1:.1f} R@10 {m.i2t.r10:.1f}, "
                                  f"t2i R@1 {m.t2i.r1:.1f} R@10 {m.t2i.r10:.1f}"), log=log)
    log(format_noise_table([0.0] + result.ratios, [result.clean] + result.metrics,
                           title=f"Robustness to input noise ({split}, {protocol_label(protocol)})"))
    write_json_atomic(out / noise_name(split), result.to_json())
    png = plot_noise(result, out / noise_name(split, "png"))
    log(f"wrote {out / noise_name(split)} and {png}")


def evaluate_run(run_dir: Path, split: str = "test", protocols: Sequence[str] = ("all",),
                 noise: str | None = None, length_analysis: bool = False, checkpoint: str = "best",
                 device: str = "auto", json_path: Path | None = None, out_dir: Path | None = None,
                 chance: bool = False, noise_seed: int = 0, length_count: int = 100,
                 fold_size: int = 1000, log: Log = console.result, ranks_path: Path | None = None,
                 topk: int = 0, gallery_path: Path | None = None, gallery_queries: int = 10,
                 lang: str | None = None, overwrite: bool = False, accept_changed: bool = False
                 ) -> dict[str, ProtocolResult]:
    """Evaluate a run directory's model on ``split``; optionally the noise and length analyses.

    Writes ``<out>/<split>_<checkpoint>.json`` (the protocol JSON), and with the analyses
    ``<out>/noise_<split>.json`` + ``.png`` and ``<out>/length_<split>.json``; ``out`` defaults to
    ``RUN_DIR/eval``. ``ranks_path`` (and ``topk``): the per-query CSV. ``gallery_path``: an HTML
    page of ``gallery_queries`` sampled queries per direction with their top ``topk`` (default 5)
    results (:mod:`train.retrieval.evaluate.gallery`). The protocols and the length analysis are checked
    against the split's size before anything is embedded. ``lang``: evaluate the captions of that language (a
    multilingual run); the JSON is then ``<split>_<checkpoint>_<lang>.json``.

    Every output is checked first (:func:`check_run_outputs`; ``overwrite``: replace existing files),
    and the run's dataset and features against its fingerprints (``accept_changed``: warn instead).
    """
    protocols = parse_protocols(protocols)
    ratios = parse_ratio_range(noise) if noise else None
    outputs = run_outputs(run_dir, split, checkpoint, lang, ratios is not None, length_analysis, json_path,
                          out_dir, ranks_path, gallery_path)
    given = {"--ranks", "--gallery"} | ({"--json"} if json_path is not None else set())
    check_run_outputs(run_dir, outputs, overwrite, [k for k in outputs if k not in given])
    run = load_run(run_dir, checkpoint, device)
    run.accept_changed = accept_changed
    _check_split(run, split, lang, protocols, fold_size, bool(noise), length_analysis, length_count)
    measure, order_sqrt = run.settings.measure, bool(run.settings.order_sqrt)
    if gallery_path is not None and not topk:
        topk = 5
    out = Path(out_dir) if out_dir is not None else RunDir(run_dir).eval_dir
    log(f"embedding the {split} split with {Path(run_dir).name} ({checkpoint} checkpoint, epoch {run.epoch}) "
        f"on {run.device}")
    emb = embed_split(run, split, lang=lang)
    which = f", {lang} captions" if lang else ""
    title = f"{Path(run_dir).name}: {split}{which} ({checkpoint} checkpoint, epoch {run.epoch}, {measure})"
    results = evaluate_retrieval(Embedded(emb.images, emb.captions, measure, order_sqrt), emb.caption_image,
                                 protocols, fold_size, str(run.device), topk=topk, log=log,
                                 report=Report(title, chance, outputs["--json"], ranks_path))
    if gallery_path is not None:
        paths = [str(run.dataset.images[i].path) for i in emb.imgids]
        page = write_gallery(gallery_path, results[protocols[0]], emb.texts, paths, emb.caption_image.numpy(),
                             gallery_queries, title=title, measure=measure, order_sqrt=order_sqrt)
        log(f"wrote the retrieval gallery {page}")
    if ratios is not None:
        _noise_analysis(run, emb, split, ratios, protocols[0], noise_seed, fold_size, out, log)
    if length_analysis:
        _length_analysis(run, emb, split, length_count, out, log)
    return results


def _check_split(run: LoadedRun, split: str, lang: str | None, protocols: Sequence[str], fold_size: int,
                 noise: bool, length_analysis: bool, length_count: int) -> None:
    """Too few images for a protocol or the length analysis, a language the run lacks: said before the
    split is embedded."""
    if lang is not None and lang not in run.dataset.languages:
        raise UserError(f"--lang {lang}: {run.settings.data} has no captions in it (it has "
                        f"{', '.join(run.dataset.languages)})")
    if lang is not None and (noise or length_analysis):
        raise UserError("--lang evaluates the retrieval protocols only: drop --noise / --length-analysis")
    n_split = _split_images(run, split, lang)
    for protocol in protocols:
        protocol_folds(protocol, n_split, fold_size, have=f"the {split} split has")
    if length_analysis and n_split < 2 * length_count:
        raise UserError(f"--length-analysis needs at least {2 * length_count} images (2 x --length-count), "
                        f"the {split} split has {n_split}")


def _length_analysis(run: LoadedRun, emb: Embeddings, split: str, length_count: int, out: Path, log: Log
                     ) -> None:
    """Table 4 of CHAIN-VSE: the longest and shortest captioned images, ``<out>/length_<split>.json``."""
    groups = run_length_analysis(emb.images, emb.captions, emb.caption_image, emb.texts, run.settings.measure,
                                 length_count, bool(run.settings.order_sqrt), run.device, log=log)
    log(format_length_table(groups, title=f"Impact of text length ({split})"))
    write_json_atomic(out / length_name(split), {
        name: {d: {"r1": getattr(m, d).r1, "meanr": getattr(m, d).meanr} for d in ("i2t", "t2i")}
        for name, m in groups.items()})
    log(f"wrote {out / length_name(split)}")
