"""``train evaluate``: parses, then :func:`train.retrieval.evaluate.run.evaluate_run` (a run), the
evaluation of embedding or similarity files (:mod:`train.cli.evaluate_files`), or
:func:`train.classification.evaluate.evaluate_run` (a classification run, :mod:`train.cli.classify`). The
options are declared without torch (their choices come from the settings); the library loads when the
command runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

from train.cli.options import (
    RETRIEVAL_RUN,
    add_checkpoint_argument,
    add_json_argument,
    add_run_arguments,
    run_from_arguments,
)
from train.config.sections import evaluate_section
from train.engine.settings import EvaluateSection, TrainSection
from vsecore.device import add_device_argument
from vsecore.errors import HelpFormatter, UserError
from vsecore.options import add_out_option, add_overwrite_option
from vsecore.pipelines_file import PipelinesFile

#: the protocols and the measures, as the settings declare them (the evaluator's own names)
PROTOCOLS: tuple[str, ...] = get_args(get_args(EvaluateSection.model_fields["protocols"].annotation)[0])
MEASURES: tuple[str, ...] = get_args(TrainSection.model_fields["measure"].annotation)


def _command(args: argparse.Namespace) -> int:
    # start-up: the evaluator (and torch) only when the command runs, not for --help or a bad option
    from train.classification.run import is_classification_run
    from train.retrieval.evaluate.run import check_topk, evaluate_run, parse_protocols  # start-up: (as above)

    run_dir = run_from_arguments(args, required=False)
    if run_dir is not None and is_classification_run(run_dir):  # its own metrics and noise analysis
        from train.cli.classify import evaluate_command  # start-up: (as above)

        _pipeline_evaluate_settings(args, ("split", "noise"))
        return evaluate_command(args, run_dir)
    _pipeline_evaluate_settings(args, ("protocols", "split", "noise", "length_analysis"))
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
                     topk=check_topk(args.topk, ranks_path, gallery is not None), gallery_path=gallery,
                     gallery_queries=args.gallery_queries, lang=args.lang, overwrite=args.overwrite,
                     accept_changed=args.accept_changed)
    elif args.sims is not None:
        from train.cli.evaluate_files import evaluate_sims  # start-up: (as above)

        evaluate_sims(args, protocols)
    elif args.img_emb is not None or args.cap_emb is not None:
        if args.img_emb is None:
            raise UserError("--img-emb is required with --cap-emb")
        from train.cli.evaluate_files import evaluate_files  # start-up: (as above)

        evaluate_files(args, protocols)
    else:
        raise UserError("nothing to evaluate: give --run RUN_DIR, --img-emb IMG.npy --cap-emb CAP.npy, "
                        "or --sims S.npy")
    return 0


def _pipeline_evaluate_settings(args: argparse.Namespace, keys: tuple[str, ...]) -> None:
    """The ``keys`` of the ``--pipeline``'s evaluate section (:class:`EvaluateSection`), unless given."""
    ev = evaluate_section(PipelinesFile.read(args.pipelines).entry(args.pipeline)) if args.pipeline else None
    if ev is None:
        return
    for key in keys:
        dest = "protocol" if key == "protocols" else key
        value = getattr(ev, key)
        setattr(args, dest, getattr(args, dest) or (list(value) if key == "protocols" else value))


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
    add_run_arguments(src, f"{RETRIEVAL_RUN}; or a run directory written by `train classify`")
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
    add_checkpoint_argument(src, "checkpoint of --run")
    src.add_argument("--lang", default=None, help="with --run: evaluate the captions of this language (a "
                     "multilingual clmr/liwe run trained on several) (default: the run's --lang)")
    _output_options(p.add_argument_group("protocol and output"))
    _analysis_options(p.add_argument_group("analyses (--run only)"))
    p.set_defaults(func=_command)


def _analysis_options(an: argparse._ArgumentGroup) -> None:
    """The noise and length analyses of a run (CHAIN-VSE section 4.3, table 4)."""
    an.add_argument("--noise", metavar="START:STOP:STEP", help="noise robustness at these ratios of replaced "
                    "characters, e.g. 0.01:0.25:0.01 (first --protocol)")
    an.add_argument("--noise-seed", type=int, default=0, help="seed of the character noise")
    an.add_argument("--length-analysis", action="store_true",
                    help="R@1 and mean rank on the images with the longest / shortest captions (table 4)")
    an.add_argument("--length-count", type=int, default=100, help="images per length group")


def _output_options(ev: argparse._ArgumentGroup) -> None:
    """The protocols, the measure, what is written, and where the ranking runs."""
    ev.add_argument("--protocol", action="append", metavar="P",
                    help=f"one of {', '.join(PROTOCOLS)}; repeatable or a comma list (default: all)")
    ev.add_argument("--fold-size", type=int, default=1000, help="images per COCO fold")
    add_json_argument(ev, "write {protocol: {i2t, t2i, rsum}} as JSON here "
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
    add_out_option(ev, "folder for the outputs of --run (default RUN_DIR/eval)")
    add_overwrite_option(ev, "replace existing --json, --ranks, --gallery and --out files (a run's own eval/ "
                             "results are replaced by a re-evaluation without it)")
    ev.add_argument("--chance", action="store_true", help="add the expected metrics of a random ranking")
    add_device_argument(ev, metavar="DEVICE")
    ev.add_argument("--block-images", type=int, default=None, help="tile height (default: by measure "
                    "and device)")
    ev.add_argument("--block-captions", type=int, default=None, help="tile width (default: by measure "
                    "and device)")
