"""``train evaluate`` of saved embeddings (``--img-emb``/``--cap-emb``) or of a similarity matrix (``--sims``)
from any codebase: the checks of its inputs and outputs, then
:func:`train.retrieval.evaluate.entry.evaluate_retrieval` (imported, with torch, when such an evaluation
runs: :mod:`train.cli.evaluate` declares the options)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from train.retrieval.evaluate.entry import Embedded, Report, Scored, evaluate_retrieval
from train.retrieval.evaluate.files import (
    caption_image_beside,
    load_caption_image,
    load_embedding_file,
    load_similarity_file,
    sims_images,
    vsepp_images,
)
from train.retrieval.evaluate.inputs import check_similarity_matrix
from train.retrieval.evaluate.protocols import vsepp_caption_image
from train.retrieval.evaluate.run import check_distinct, check_topk
from vsecore import console
from vsecore.errors import UserError
from vsecore.outputs import check_output_file


def _check_file_outputs(args: argparse.Namespace, inputs: list[str]) -> None:
    """``--json`` and ``--ranks`` of saved embeddings or similarities: not an input, not inside a dataset,
    store or run, an existing file only with ``--overwrite``, not the same file."""
    outputs = {"--json": Path(args.json) if args.json else None,
               "--ranks": Path(args.ranks) if args.ranks else None}
    check_distinct(outputs)
    for option, path in outputs.items():
        if path is not None:
            check_output_file(path, inputs=inputs, overwrite=args.overwrite, option=option)


def evaluate_files(args: argparse.Namespace, protocols: list[str]) -> None:
    """Saved image and caption embeddings (``--img-emb``, ``--cap-emb``), ranked under ``protocols``."""
    if args.measure is None:
        raise UserError("--measure order|cosine is required with --img-emb")
    if args.cap_emb is None:
        raise UserError("--cap-emb is required with --img-emb")
    if args.noise or args.length_analysis or args.gallery:
        raise UserError("--noise, --length-analysis and --gallery re-encode or read the captions and "
                        "images: use --run")
    ranks_path = Path(args.ranks) if args.ranks else None
    topk = check_topk(args.topk, ranks_path)
    if args.caption_image is not None and args.captions_per_image is not None:
        raise UserError("give --caption-image or --captions-per-image, not both")
    ci_file = args.caption_image
    if ci_file is None and args.captions_per_image is None:
        ci_file = caption_image_beside(args.cap_emb)
        if ci_file is not None:
            console.info(f"note: using {ci_file} (the image row of each caption, found beside --cap-emb; "
                         "give --captions-per-image K to use the fixed VSE++ layout instead)")
    _check_file_outputs(args, [args.img_emb, args.cap_emb, ci_file])
    captions = load_embedding_file(args.cap_emb, "caption")
    if ci_file is not None:
        images = load_embedding_file(args.img_emb, "image")
        caption_image = torch.from_numpy(load_caption_image(ci_file, images.shape[0], captions.shape[0]))
    else:
        k = 5 if args.captions_per_image is None else args.captions_per_image
        images = vsepp_images(load_embedding_file(args.img_emb, "image"), captions.shape[0], k, console.info)
        caption_image = torch.from_numpy(vsepp_caption_image(images.shape[0], k))
    embedded = Embedded(torch.from_numpy(images), torch.from_numpy(captions), args.measure, args.order_sqrt)
    evaluate_retrieval(embedded, caption_image, protocols, args.fold_size, args.device,
                       block_images=args.block_images, block_captions=args.block_captions, topk=topk,
                       report=Report(f"{args.img_emb} / {args.cap_emb}", args.chance,
                                     Path(args.json) if args.json else None, ranks_path))


def evaluate_sims(args: argparse.Namespace, protocols: list[str]) -> None:
    """A saved similarity matrix (``--sims``), ranked under ``protocols``."""
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
    topk = check_topk(args.topk, ranks_path)
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
    evaluate_retrieval(Scored(sims, args.sims_transposed), caption_image, protocols, args.fold_size,
                       args.device, block_images=args.block_images, block_captions=args.block_captions,
                       topk=topk, report=Report(str(args.sims), args.chance,
                                                Path(args.json) if args.json else None, ranks_path))
