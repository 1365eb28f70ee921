"""The CHAIN-VSE analyses built on the evaluation: robustness to character noise, and caption length.

Noise (CHAIN-VSE section 4.3, figure 5): for each ratio, every caption gets
``max(1, round_half_up(ratio * len))`` characters (capped at its length) at distinct random
positions replaced by a *different* character drawn uniformly from an alphabet (by default the
characters of the captions themselves); the captions are re-encoded, the images kept, and R@1 and
R@10 are reported both ways. The noise of a ratio depends only on ``(seed, ratio)``, so a ratio's
captions are the same whichever other ratios are evaluated.

Length (table 4): an image's caption length is the mean length in characters of its captions. The
``count`` images with the longest and with the shortest mean length (ties: lower image row first)
are each evaluated as a retrieval set of their own (those images and their captions only), and
R@1 and Mean r are reported both ways.

Both take plain tensors and an ``encode_texts(list[str]) -> (M, d)`` callable, so they run on any
model or on a toy encoder, and both rank through the one evaluation entry,
:func:`train.retrieval.evaluate.entry.evaluate_retrieval` (same tie rule, same warnings, once per evaluated
set).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from train.engine.noise import (  # noqa: F401 - the analysis's primitives, re-exported
    add_character_noise,
    alphabet_from_chars_json,
    caption_alphabet,
    parse_ratio_range,
)
from train.retrieval.evaluate.entry import Embedded, evaluate_retrieval
from train.retrieval.evaluate.metrics import RetrievalMetrics
from train.retrieval.evaluate.protocols import protocol_folds, select_image_rows
from train.retrieval.evaluate.ranking import Log
from vsecore.errors import UserError

#: re-encodes captions: list of M strings -> (M, d) embeddings
TextEncoder = Callable[[list[str]], "torch.Tensor | np.ndarray"]


# --------------------------------------------------------------------------- noise


@dataclass(frozen=True)
class NoiseResult:
    """Metrics per noise ratio, with the clean captions' metrics for reference."""

    protocol: str
    ratios: list[float]
    metrics: list[RetrievalMetrics]
    clean: RetrievalMetrics
    seed: int

    def to_json(self) -> dict[str, object]:
        """``{"protocol", "seed", "clean", "ratios": [{"ratio", "i2t": {"r1", "r10"}, "t2i": {...}}]}``."""
        def short(m: RetrievalMetrics) -> dict[str, dict[str, float]]:
            return {"i2t": {"r1": m.i2t.r1, "r10": m.i2t.r10}, "t2i": {"r1": m.t2i.r1, "r10": m.t2i.r10}}
        return {"protocol": self.protocol, "seed": self.seed, "clean": short(self.clean),
                "ratios": [{"ratio": r, **short(m)} for r, m in zip(self.ratios, self.metrics, strict=True)]}


def noise_robustness(images: torch.Tensor | np.ndarray, texts: Sequence[str],
                     caption_image: torch.Tensor | np.ndarray, encode_texts: TextEncoder, measure: str,
                     ratios: Sequence[float], protocol: str = "1k", alphabet: Sequence[str] | None = None,
                     seed: int = 0, order_sqrt: bool = False, fold_size: int = 1000,
                     device: str | torch.device | None = None,
                     progress: Callable[[float, RetrievalMetrics], None] | None = None,
                     log: Log | None = None) -> NoiseResult:
    """Retrieval of noisy captions against clean images, per noise ratio.

    Args:
        images: (N, d) image embeddings.
        texts: M caption strings; caption_image: (M,) image row of each.
        encode_texts: maps a list of strings to (len, d) caption embeddings.
        ratios: fractions of characters replaced, e.g. 0.01 .. 0.25.
        protocol: evaluation protocol; only the captions it uses are encoded.
        alphabet: replacement characters (default: the captions' own characters).
        progress: called with (ratio, metrics) after each ratio.
        log: where the evaluator's warnings go (default: stderr).
    """
    img = torch.as_tensor(images, dtype=torch.float32)
    ci = torch.as_tensor(np.asarray(caption_image), dtype=torch.int64)
    if len(texts) != ci.numel():
        raise UserError(f"{len(texts)} texts but {ci.numel()} caption_image entries")
    stop = max(b for _, b in protocol_folds(protocol, img.shape[0], fold_size))
    used = torch.nonzero(ci < stop)[:, 0].numpy()
    used_texts = [texts[k] for k in used]
    used_ci = ci[used]
    alphabet = list(alphabet) if alphabet is not None else caption_alphabet(texts)

    def evaluate(captions: Sequence[str]) -> RetrievalMetrics:
        cap = torch.as_tensor(encode_texts(list(captions)), dtype=torch.float32)
        result = evaluate_retrieval(Embedded(img[:stop], cap, measure, order_sqrt), used_ci, [protocol],
                                    fold_size, device, log=log)
        return result[protocol].metrics

    clean = evaluate(used_texts)
    metrics = []
    for ratio in ratios:
        rng = np.random.default_rng([seed, int(round(ratio * 1_000_000))])
        m = evaluate(add_character_noise(used_texts, ratio, alphabet, rng))
        metrics.append(m)
        if progress is not None:
            progress(ratio, m)
    return NoiseResult(protocol=protocol, ratios=list(ratios), metrics=metrics, clean=clean, seed=seed)


def plot_noise(result: NoiseResult, path: str | Path, title: str | None = None) -> Path:
    """PNG of R@1 (dotted) and R@10 (continuous) against the noise ratio, as CHAIN-VSE figure 5."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [0.0] + [100 * r for r in result.ratios]
    series = [result.clean] + result.metrics
    fig, ax = plt.subplots(figsize=(6, 4))
    lines = (("i2t", "image to text", "tab:blue"), ("t2i", "text to image", "tab:red"))
    for direction, label, colour in lines:
        r10 = [getattr(m, direction).r10 for m in series]
        r1 = [getattr(m, direction).r1 for m in series]
        ax.plot(x, r10, "-", color=colour, marker="o", markersize=3, label=f"{label} R@10")
        ax.plot(x, r1, ":", color=colour, marker="o", markersize=3, label=f"{label} R@1")
    ax.set_xlabel("noise ratio (% of characters replaced)")
    ax.set_ylabel("recall (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"Robustness to input noise ({result.protocol})")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


# --------------------------------------------------------------------------- length


def image_caption_lengths(texts: Sequence[str], caption_image: np.ndarray | torch.Tensor,
                          n_images: int) -> np.ndarray:
    """Mean caption length in characters of each image, (N,) float64 (NaN for an image without captions)."""
    ci = np.asarray(caption_image, dtype=np.int64)
    lengths = np.array([len(t) for t in texts], dtype=np.float64)
    totals = np.bincount(ci, weights=lengths, minlength=n_images)
    counts = np.bincount(ci, minlength=n_images)
    with np.errstate(invalid="ignore", divide="ignore"):
        return totals / counts


def length_groups(texts: Sequence[str], caption_image: np.ndarray | torch.Tensor, n_images: int,
                  count: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Image rows with the ``count`` longest and the ``count`` shortest mean caption lengths.

    Ties go to the lower image row. Returns (longest (count,), shortest (count,)).
    """
    if n_images < 2 * count:
        raise UserError(f"the length analysis needs at least {2 * count} images, got {n_images}")
    mean_length = image_caption_lengths(texts, caption_image, n_images)
    rows = np.arange(n_images)
    longest = np.lexsort((rows, -mean_length))[:count]
    shortest = np.lexsort((rows, mean_length))[:count]
    return longest, shortest


def length_analysis(images: torch.Tensor | np.ndarray, captions: torch.Tensor | np.ndarray,
                    caption_image: torch.Tensor | np.ndarray, texts: Sequence[str], measure: str,
                    count: int = 100, order_sqrt: bool = False, device: str | torch.device | None = None,
                    log: Log | None = None) -> dict[str, RetrievalMetrics]:
    """Retrieval restricted to the images with the longest / shortest captions (CHAIN-VSE table 4).

    Args:
        images: (N, d); captions: (M, d); caption_image: (M,); texts: the M caption strings.
        count: images per group (100 in the paper).
        log: where the evaluator's warnings go (default: stderr).

    Returns:
        ``{"<count> longest": metrics, "<count> shortest": metrics}``, each evaluated among its own
        ``count`` images and their captions.
    """
    img = torch.as_tensor(images, dtype=torch.float32)
    cap = torch.as_tensor(captions, dtype=torch.float32)
    ci = torch.as_tensor(np.asarray(caption_image), dtype=torch.int64)
    if len(texts) != cap.shape[0]:
        raise UserError(f"{len(texts)} texts but {cap.shape[0]} caption embeddings")
    longest, shortest = length_groups(texts, ci.numpy(), img.shape[0], count)
    out = {}
    for name, rows in ((f"{count} longest", longest), (f"{count} shortest", shortest)):
        g_img, g_cap, g_ci = select_image_rows(img, cap, ci, rows)
        out[name] = evaluate_retrieval(Embedded(g_img, g_cap, measure, order_sqrt), g_ci, ["all"],
                                       device=device, log=log)["all"].metrics
    return out
