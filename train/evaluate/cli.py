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
blocked pass (see :func:`train.evaluate.tables.write_ranks_csv`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from train.evaluate.files import (
    caption_image_beside,
    load_caption_image,
    load_embedding_file,
    load_similarity_file,
    sims_images,
    vsepp_images,
)
from train.evaluate.inputs import MEASURES, check_similarity_matrix
from train.evaluate.metrics import chance_metrics
from train.evaluate.protocols import (
    PROTOCOLS,
    ProtocolResult,
    evaluate_protocols,
    evaluate_similarities,
    protocol_folds,
    vsepp_caption_image,
)
from train.evaluate.ranking import Log, TileHook
from train.evaluate.tables import (
    format_length_table,
    format_noise_table,
    format_results,
    protocol_label,
    results_json,
    write_ranks_csv,
)
from train.run_args import add_run_arguments
from train.rundir import RunDir, evaluation_name, length_name, noise_name
from train.runs import Embeddings, LoadedRun
from vsecore.device import DEVICE_HELP
from vsecore.errors import HelpFormatter, UserError
from vsecore.io import write_json_atomic
from vsecore.outputs import check_output_file


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


def _progress_hook(results_total: int) -> tuple[TileHook, Callable[[], None]]:
    from vsecore.console import progress

    bar = progress(total=results_total, unit="pair", unit_scale=True, desc="ranking")

    def on_tile(pairs: int) -> None:
        bar.update(pairs)

    return on_tile, bar.close


def _pairs_total(n_images: int, caption_image: torch.Tensor, protocols: Sequence[str], fold_size: int,
                 have: str) -> int:
    total = 0
    for protocol in protocols:
        for start, stop in protocol_folds(protocol, n_images, fold_size, have):
            total += (stop - start) * int(((caption_image >= start) & (caption_image < stop)).sum())
    return total


def _check_topk(topk: int | None, ranks_path: Path | None, gallery: bool = False) -> int:
    if topk is None:
        return 0
    if topk < 1:
        raise UserError(f"--topk must be at least 1, got {topk}")
    if ranks_path is None and not gallery:
        raise UserError("--topk K lists each query's K best candidates in the --ranks OUT.csv file or the "
                        "--gallery page: give one of them")
    return topk


def report_evaluation(evaluate: Callable[[TileHook, Log], dict[str, ProtocolResult]], n_images: int,
                      caption_image: torch.Tensor, protocols: Sequence[str], what: str, fold_size: int = 1000,
                      chance: bool = False, json_path: Path | None = None, ranks_path: Path | None = None,
                      title: str | None = None, log: Log = print, have: str = "the embeddings have"
                      ) -> dict[str, ProtocolResult]:
    """Run ``evaluate(on_tile, log)`` with a progress bar; print the table, write the JSON and the ranks CSV.

    ``n_images`` and ``caption_image`` (M,) describe the evaluated set (for the progress total and
    ``chance``); ``what`` goes into the summary line, ``have`` into a too-small-for-the-protocol error.
    """
    t0 = time.perf_counter()
    on_tile, close = _progress_hook(_pairs_total(n_images, caption_image, protocols, fold_size, have))
    warnings: list[str] = []

    def log_now_warn_later(line: str) -> None:
        # warnings qualify the numbers: print them under the table; notes (compiling) right away
        (warnings.append if line.startswith("warning:") else log)(line)

    try:
        results = evaluate(on_tile, log_now_warn_later)
    finally:
        close()
    chance_rows = None
    if chance:
        chance_rows = {}
        for protocol in protocols:
            start, stop = protocol_folds(protocol, n_images, fold_size)[0]
            f_ci = caption_image[(caption_image >= start) & (caption_image < stop)] - start
            chance_rows[protocol] = chance_metrics(f_ci.numpy(), stop - start)
    log(format_results(results, chance_rows, title))
    for line in warnings:
        log(line)
    elapsed = time.perf_counter() - t0
    summary = (f"evaluated {n_images} images x {caption_image.numel()} captions ({what}) under "
               f"{', '.join(protocol_label(p) for p in protocols)} in {elapsed:.1f}s")
    if json_path is not None:
        write_json_atomic(json_path, results_json(results))
        summary += f"; wrote {json_path}"
    if ranks_path is not None:
        rows = write_ranks_csv(ranks_path, results, caption_image.numpy())
        summary += f"; wrote {rows} query rows to {ranks_path}"
    log(summary)
    return results


def evaluate_and_report(images: torch.Tensor, captions: torch.Tensor, caption_image: torch.Tensor,
                        measure: str, protocols: Sequence[str], order_sqrt: bool = False,
                        fold_size: int = 1000, device: str = "auto", chance: bool = False,
                        json_path: Path | None = None, title: str | None = None,
                        block_images: int | None = None, block_captions: int | None = None,
                        log: Log = print, ranks_path: Path | None = None, topk: int = 0
                        ) -> dict[str, ProtocolResult]:
    """Evaluate (N, d) images and (M, d) captions under ``protocols``; print the table, write the outputs."""
    def evaluate(on_tile: TileHook, log: Log) -> dict[str, ProtocolResult]:
        return evaluate_protocols(images, captions, caption_image, measure, protocols, order_sqrt, fold_size,
                                  device, block_images, block_captions, on_tile=on_tile, topk=topk, log=log)

    what = f"d = {images.shape[1]}, {measure}{' sqrt' if measure == 'order' and order_sqrt else ''}"
    return report_evaluation(evaluate, images.shape[0], caption_image, protocols, what, fold_size, chance,
                             json_path, ranks_path, title, log)


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
    """The output-path rule for a reader of a run (:meth:`train.rundir.RunDir.check_eval_output`):
    no input of the run, inside the run only its ``eval/`` folder, an existing file only with
    ``overwrite`` (the run's own eval files among the ``defaults`` outputs excepted), and no two
    outputs the same file."""
    from train.runs import run_inputs

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
    from train.evaluate.analysis import alphabet_from_chars_json, noise_robustness, plot_noise
    from train.runs import encode_texts

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
                 fold_size: int = 1000, log: Log = print, ranks_path: Path | None = None,
                 topk: int = 0, gallery_path: Path | None = None, gallery_queries: int = 10,
                 lang: str | None = None, overwrite: bool = False, accept_changed: bool = False
                 ) -> dict[str, ProtocolResult]:
    """Evaluate a run directory's model on ``split``; optionally the noise and length analyses.

    Writes ``<out>/<split>_<checkpoint>.json`` (the protocol JSON), and with the analyses
    ``<out>/noise_<split>.json`` + ``.png`` and ``<out>/length_<split>.json``; ``out`` defaults to
    ``RUN_DIR/eval``. ``ranks_path`` (and ``topk``): the per-query CSV. ``gallery_path``: an HTML
    page of ``gallery_queries`` sampled queries per direction with their top ``topk`` (default 5)
    results (:mod:`train.evaluate.gallery`). The protocols and the length analysis are checked against the
    split's size before anything is embedded. ``lang``: evaluate the captions of that language (a
    multilingual run); the JSON is then ``<split>_<checkpoint>_<lang>.json``.

    Every output is checked first (:func:`check_run_outputs`; ``overwrite``: replace existing files),
    and the run's dataset and features against its fingerprints (``accept_changed``: warn instead).
    """
    from train.evaluate.analysis import length_analysis as run_length_analysis
    from train.evaluate.analysis import parse_ratio_range
    from train.runs import embed_split, load_run

    protocols = parse_protocols(protocols)
    ratios = parse_ratio_range(noise) if noise else None
    outputs = run_outputs(run_dir, split, checkpoint, lang, ratios is not None, length_analysis, json_path,
                          out_dir, ranks_path, gallery_path)
    given = {"--ranks", "--gallery"} | ({"--json"} if json_path is not None else set())
    check_run_outputs(run_dir, outputs, overwrite, [k for k in outputs if k not in given])
    run = load_run(run_dir, checkpoint, device)
    run.accept_changed = accept_changed
    # too few images for a protocol: say so now, not after embedding the split
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
    measure, order_sqrt = run.settings.measure, bool(run.settings.order_sqrt)
    if gallery_path is not None and not topk:
        topk = 5
    out = Path(out_dir) if out_dir is not None else RunDir(run_dir).eval_dir
    log(f"embedding the {split} split with {Path(run_dir).name} ({checkpoint} checkpoint, epoch {run.epoch}) "
        f"on {run.device}")
    emb = embed_split(run, split, lang=lang)
    which = f", {lang} captions" if lang else ""
    title = f"{Path(run_dir).name}: {split}{which} ({checkpoint} checkpoint, epoch {run.epoch}, {measure})"
    results = evaluate_and_report(emb.images, emb.captions, emb.caption_image, measure, protocols, order_sqrt,
                                  fold_size, str(run.device), chance, outputs["--json"], title,
                                  log=log,
                                  ranks_path=ranks_path, topk=topk)
    if gallery_path is not None:
        from train.evaluate.gallery import write_gallery

        paths = [str(run.dataset.images[i].path) for i in emb.imgids]
        page = write_gallery(gallery_path, results[protocols[0]], emb.texts, paths, emb.caption_image.numpy(),
                             gallery_queries, title=title)
        log(f"wrote the retrieval gallery {page}")
    if ratios is not None:
        _noise_analysis(run, emb, split, ratios, protocols[0], noise_seed, fold_size, out, log)
    if length_analysis:
        groups = run_length_analysis(emb.images, emb.captions, emb.caption_image, emb.texts, measure,
                                     length_count, order_sqrt, run.device, log=log)
        log(format_length_table(groups, title=f"Impact of text length ({split})"))
        write_json_atomic(out / length_name(split), {
            name: {d: {"r1": getattr(m, d).r1, "meanr": getattr(m, d).meanr} for d in ("i2t", "t2i")}
            for name, m in groups.items()})
        log(f"wrote {out / length_name(split)}")
    return results


def _check_file_outputs(args: argparse.Namespace, inputs: list[str]) -> None:
    """``--json`` and ``--ranks`` of saved embeddings or similarities: not an input, not inside a dataset,
    store or run, an existing file only with ``--overwrite``, not the same file."""
    outputs = {"--json": Path(args.json) if args.json else None,
               "--ranks": Path(args.ranks) if args.ranks else None}
    check_distinct(outputs)
    for option, path in outputs.items():
        if path is not None:
            check_output_file(path, inputs=inputs, overwrite=args.overwrite, option=option)


def _evaluate_files(args: argparse.Namespace, protocols: list[str]) -> None:
    if args.measure is None:
        raise UserError("--measure order|cosine is required with --img-emb")
    if args.cap_emb is None:
        raise UserError("--cap-emb is required with --img-emb")
    if args.noise or args.length_analysis or args.gallery:
        raise UserError("--noise, --length-analysis and --gallery re-encode or read the captions and "
                        "images: use --run")
    ranks_path = Path(args.ranks) if args.ranks else None
    topk = _check_topk(args.topk, ranks_path)
    if args.caption_image is not None and args.captions_per_image is not None:
        raise UserError("give --caption-image or --captions-per-image, not both")
    ci_file = args.caption_image
    if ci_file is None and args.captions_per_image is None:
        ci_file = caption_image_beside(args.cap_emb)
        if ci_file is not None:
            print(f"note: using {ci_file} (the image row of each caption, found beside --cap-emb; give "
                  "--captions-per-image K to use the fixed VSE++ layout instead)")
    _check_file_outputs(args, [args.img_emb, args.cap_emb, ci_file])
    captions = load_embedding_file(args.cap_emb, "caption")
    if ci_file is not None:
        images = load_embedding_file(args.img_emb, "image")
        caption_image = torch.from_numpy(load_caption_image(ci_file, images.shape[0], captions.shape[0]))
    else:
        k = 5 if args.captions_per_image is None else args.captions_per_image
        images = vsepp_images(load_embedding_file(args.img_emb, "image"), captions.shape[0], k, print)
        caption_image = torch.from_numpy(vsepp_caption_image(images.shape[0], k))
    evaluate_and_report(torch.from_numpy(images), torch.from_numpy(captions), caption_image, args.measure,
                        protocols, args.order_sqrt, args.fold_size, args.device, args.chance,
                        Path(args.json) if args.json else None, title=f"{args.img_emb} / {args.cap_emb}",
                        block_images=args.block_images, block_captions=args.block_captions,
                        ranks_path=ranks_path, topk=topk)


def _evaluate_sims(args: argparse.Namespace, protocols: list[str]) -> None:
    if args.measure is not None or args.order_sqrt:
        raise UserError("--sims is a similarity matrix already (larger = more similar): drop --measure and "
                        "--order-sqrt")
    if args.noise or args.length_analysis or args.gallery:
        raise UserError("--noise, --length-analysis and --gallery re-encode or read the captions and "
                        "images: use --run")
    if args.caption_image is not None and args.captions_per_image is not None:
        raise UserError("give --caption-image or --captions-per-image, not both")
    k = 5 if args.captions_per_image is None else args.captions_per_image
    if k < 1:
        raise UserError("--captions-per-image must be at least 1")
    ranks_path = Path(args.ranks) if args.ranks else None
    topk = _check_topk(args.topk, ranks_path)
    _check_file_outputs(args, [args.sims, args.caption_image])
    sims = load_similarity_file(args.sims)
    if args.caption_image is not None:
        if sims.ndim != 2:
            raise UserError(f"{args.sims}: a similarity matrix must be 2-D, got shape {sims.shape}")
        n, m = (sims.shape[1], sims.shape[0]) if args.sims_transposed else sims.shape
        caption_image = torch.from_numpy(load_caption_image(args.caption_image, n, m, grouped=True))
    else:
        n = sims_images(sims, k, args.sims_transposed, str(args.sims))
        caption_image = torch.from_numpy(vsepp_caption_image(n, k))
    check_similarity_matrix(sims, caption_image, args.sims_transposed, name=str(args.sims))

    def evaluate(on_tile: TileHook, log: Log) -> dict[str, ProtocolResult]:
        return evaluate_similarities(sims, caption_image, protocols, args.fold_size, args.device,
                                     args.block_images, args.block_captions, on_tile, topk,
                                     args.sims_transposed, log)

    what = f"precomputed {sims.dtype} similarities{', transposed' if args.sims_transposed else ''}"
    report_evaluation(evaluate, n, caption_image, protocols, what, args.fold_size, args.chance,
                      Path(args.json) if args.json else None, ranks_path, title=str(args.sims),
                      have="the similarity matrix has")


def _command(args: argparse.Namespace) -> int:
    from train.run_args import run_from_arguments

    run_dir = run_from_arguments(args, required=False)
    if run_dir is not None:
        from train.classify import is_classification_run

        if is_classification_run(run_dir):  # text classification: its own metrics and noise analysis
            from train.classify_cli import evaluate_command

            _pipeline_evaluate_settings(args)
            return evaluate_command(args, run_dir)
    if args.pipeline:  # the pipeline's evaluation settings, unless given explicitly
        from pipelines.schema import get_pipeline

        ev = get_pipeline(args.pipeline, args.pipelines).evaluate
        if ev is not None:
            args.protocol = args.protocol or list(ev.protocols)
            args.split = args.split or ev.split
            args.noise = args.noise or ev.noise
            args.length_analysis = args.length_analysis or ev.length_analysis
    args.split = args.split or "test"
    protocols = parse_protocols(args.protocol)
    given = {"--run/--pipeline": run_dir, "--img-emb/--cap-emb": args.img_emb or args.cap_emb,
             "--sims": args.sims}
    sources = [name for name, value in given.items() if value]
    if len(sources) > 1:
        raise UserError(f"give one of --run (or --pipeline), --img-emb/--cap-emb or --sims, not "
                        f"{' and '.join(sources)}")
    if args.sims_transposed and args.sims is None:
        raise UserError("--sims-transposed goes with --sims")
    if args.lang is not None and run_dir is None:
        raise UserError("--lang goes with --run (or --pipeline): it picks the run's captions of a language")
    if run_dir is not None:
        if args.measure is not None:
            raise UserError("--measure comes from the run's configuration; drop it with --run")
        ranks_path = Path(args.ranks) if args.ranks else None
        gallery = Path(args.gallery) if args.gallery else None
        if args.gallery_queries < 1:
            raise UserError(f"--gallery-queries must be at least 1, got {args.gallery_queries}")
        evaluate_run(run_dir, args.split, protocols, args.noise, args.length_analysis, args.checkpoint,
                     args.device, Path(args.json) if args.json else None,
                     Path(args.out) if args.out else None, args.chance, args.noise_seed, args.length_count,
                     args.fold_size, ranks_path=ranks_path,
                     topk=_check_topk(args.topk, ranks_path, gallery is not None), gallery_path=gallery,
                     gallery_queries=args.gallery_queries, lang=args.lang, overwrite=args.overwrite,
                     accept_changed=args.accept_changed)
    elif args.sims is not None:
        _evaluate_sims(args, protocols)
    elif args.img_emb is not None or args.cap_emb is not None:
        if args.img_emb is None:
            raise UserError("--img-emb is required with --cap-emb")
        _evaluate_files(args, protocols)
    else:
        raise UserError("nothing to evaluate: give --run RUN_DIR, --img-emb IMG.npy --cap-emb CAP.npy, "
                        "or --sims S.npy")
    return 0


def _pipeline_evaluate_settings(args: argparse.Namespace) -> None:
    """``--split`` and ``--noise`` from the ``--pipeline``'s evaluate section, unless given."""
    if args.pipeline:
        from pipelines.schema import get_pipeline

        ev = get_pipeline(args.pipeline, args.pipelines).evaluate
        if ev is not None:
            args.split = args.split or ev.split
            args.noise = args.noise or ev.noise


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``evaluate`` subcommand."""
    p = subparsers.add_parser(
        "evaluate", help="R@K / median / mean rank of a run or of saved embeddings (COCO-1k/5cv/5k, all)",
        description="Image-to-text and text-to-image retrieval metrics (R@1, R@5, R@10, median and mean "
        "rank), computed in bounded-memory blocks, under the protocols COCO-1k (first 1,000-image fold), "
        "COCO-5cv (average of five folds), COCO-5k (all 5,000) and all (the whole set, e.g. Flickr 1k test). "
        "With --run, also the CHAIN-VSE noise-robustness and text-length analyses.",
        formatter_class=HelpFormatter)
    src = p.add_argument_group("what to evaluate")
    add_run_arguments(src)
    src.add_argument("--img-emb", metavar="IMG.npy", help="image embeddings, one row per image "
                     "(VSE++ layout)")
    src.add_argument("--cap-emb", metavar="CAP.npy", help="caption embeddings, captions-per-image rows per "
                     "image, in image order")
    src.add_argument("--sims", metavar="S.npy", help="a precomputed (images, captions) similarity matrix "
                     "from any codebase (e.g. SCAN), float16/32/64, larger = more similar, captions in the "
                     "--cap-emb layout; memory-mapped and read in tiles")
    src.add_argument("--sims-transposed", action="store_true",
                     help="--sims is stored as (captions, images)")
    src.add_argument("--measure", choices=MEASURES, default=None,
                     help="similarity of --img-emb/--cap-emb (a run uses its own; --sims has none)")
    src.add_argument("--order-sqrt", action="store_true",
                     help="order violation with the square root (released VSE/CHAIN code); same rankings")
    src.add_argument("--captions-per-image", type=int, default=None,
                     help="captions per image in --cap-emb / --sims, in image order (the VSE++ layout; "
                     "default 5)")
    src.add_argument("--caption-image", metavar="CI.npy",
                     help="the image row of each caption of --cap-emb / --sims ((M,) integers, any number of "
                     "captions per image), as export-embeddings writes it; with --cap-emb X_cap.npy, "
                     "X_caption_image.npy beside it is used when there and --captions-per-image is not given")
    src.add_argument("--split", default=None, choices=("train", "val", "test"),
                     help="split of --run (default test, or the pipeline's)")
    src.add_argument("--checkpoint", default="best", choices=("best", "last"), help="checkpoint of --run")
    src.add_argument("--lang", default=None, help="with --run: evaluate the captions of this language (a "
                     "multilingual clmr/liwe run trained on several) (default: the run's --lang)")
    ev = p.add_argument_group("protocol and output")
    ev.add_argument("--protocol", action="append", metavar="P",
                    help=f"one of {', '.join(PROTOCOLS)}; repeatable or a comma list (default: all)")
    ev.add_argument("--fold-size", type=int, default=1000, help="images per COCO fold")
    ev.add_argument("--json", metavar="PATH", help="write {protocol: {i2t, t2i, rsum}} as JSON here "
                    "(--run default: RUN_DIR/eval/<split>_<checkpoint>.json)")
    ev.add_argument("--ranks", metavar="OUT.csv", help="one CSV row per query and protocol fold: protocol, "
                    "fold, direction, query, rank (1-based, ties counted against the ground truth), ties, "
                    "ground truth index(es); indices are rows of the inputs")
    ev.add_argument("--topk", type=int, metavar="K", default=None, help="with --ranks: each query's K best "
                    "candidates and their scores (score descending, lower index first among equal scores)")
    ev.add_argument("--gallery", metavar="OUT.html", help="with --run: a self-contained HTML page of sampled "
                    "queries with their top --topk results (default 5), ground truth marked")
    ev.add_argument("--gallery-queries", type=int, metavar="N", default=10,
                    help="sampled queries per direction in the --gallery page")
    ev.add_argument("--out", metavar="DIR", help="folder for the outputs of --run (default RUN_DIR/eval)")
    ev.add_argument("--overwrite", action="store_true",
                    help="replace existing --json, --ranks, --gallery and --out files (a run's own eval/ "
                         "results are replaced by a re-evaluation without it)")
    ev.add_argument("--chance", action="store_true", help="add the expected metrics of a random ranking")
    ev.add_argument("--device", default="auto", metavar="DEVICE", help=DEVICE_HELP)
    ev.add_argument("--block-images", type=int, default=None, help="tile height (default: by measure "
                    "and device)")
    ev.add_argument("--block-captions", type=int, default=None, help="tile width (default: by measure "
                    "and device)")
    an = p.add_argument_group("analyses (--run only)")
    an.add_argument("--noise", metavar="START:STOP:STEP", help="noise robustness at these ratios of replaced "
                    "characters, e.g. 0.01:0.25:0.01 (first --protocol)")
    an.add_argument("--noise-seed", type=int, default=0, help="seed of the character noise")
    an.add_argument("--length-analysis", action="store_true",
                    help="R@1 and mean rank on the images with the longest / shortest captions (table 4)")
    an.add_argument("--length-count", type=int, default=100, help="images per length group")
    p.set_defaults(func=_command)
