"""``train export-embeddings --run R``: a run's image and caption embeddings as ``.npy`` files.

For each split asked for, in the layout other codebases evaluate (VSE++/SCAN): ``{split}_img.npy``
(N, d) one row per image in the split's image order, ``{split}_cap.npy`` (M, d) the captions grouped
by image in the same order, ``{split}_caption_image.npy`` (M,) the row of each caption's image, and
``{split}_ids.json`` (each image's prepared imgid, COCO id where known and file; each caption's
text). ``train evaluate --img-emb {split}_img.npy --cap-emb {split}_cap.npy`` reads them back, with
the caption-image file found beside them, to exactly the run's own numbers for any number of captions
per image (a ragged split such as the COCO sample's test split included).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from train.retrieval.loaded import embed_split
from train.retrieval.open import load_run, run_inputs
from vsecore import console
from vsecore.io import atomic_file, write_json_atomic
from vsecore.outputs import check_output_folder


def _save(path: Path, array: np.ndarray) -> None:
    with atomic_file(path, "wb") as fh:
        np.save(fh, array)


def export_names(splits: list[str]) -> list[str]:
    """The files :func:`export_embeddings` writes for ``splits``."""
    return [f"{split}_{suffix}" for split in splits
            for suffix in ("img.npy", "cap.npy", "caption_image.npy", "ids.json")]


def export_embeddings(run_dir: str | Path, out: str | Path, splits: list[str], checkpoint: str = "best",
                      device: str = "auto", overwrite: bool = False, accept_changed: bool = False
                      ) -> list[Path]:
    """Embed ``splits`` with the run's model and write the files above into ``out``; returns them.

    ``out`` may not be an input (the run, its dataset or store) nor lie inside a dataset, store or run;
    files of the same names already there are replaced only with ``overwrite`` (the folder's other
    files are kept). ``accept_changed``: use a run whose inputs changed since training (a warning).
    """
    inputs = [run_dir, *run_inputs(run_dir)]
    out = check_output_folder(out, export_names(splits), inputs=inputs, overwrite=overwrite)
    run = load_run(run_dir, checkpoint, device)
    run.accept_changed = accept_changed
    written: list[Path] = []
    for split in splits:
        emb = embed_split(run, split)
        order = np.argsort(emb.caption_image.numpy(), kind="stable")  # captions grouped by image
        caption_image = emb.caption_image.numpy()[order]
        images = [run.dataset.images[i] for i in emb.imgids]
        ids = {"run": str(Path(run_dir).resolve()), "checkpoint": checkpoint, "epoch": run.epoch,
               "measure": run.settings.measure, "lang": run.settings.lang,
               "images": [{"imgid": int(im.imgid), "cocoid": im.cocoid, "file": str(im.path)}
                          for im in images],
               "captions": [emb.texts[k] for k in order]}
        files = {f"{split}_img.npy": emb.images.numpy(), f"{split}_cap.npy": emb.captions.numpy()[order],
                 f"{split}_caption_image.npy": caption_image.astype(np.int64)}
        for name, array in files.items():
            _save(out / name, np.ascontiguousarray(array, dtype=array.dtype))
            written.append(out / name)
        write_json_atomic(out / f"{split}_ids.json", ids)
        written.append(out / f"{split}_ids.json")
        console.info(f"{split}: {len(images)} images, {len(order)} captions, d = {emb.images.shape[1]}")
    return written
