"""Figures written next to the numbers they show: training curves of a run, runs compared.

Every figure is written atomically (a complete PNG or none) with matplotlib's Agg backend, so it
works without a display and a killed run never leaves a truncated image.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vsecore.io import atomic_file


def new_figure(panels: int = 1, width: float = 6.0, height: float = 4.0) -> tuple[Any, Any]:
    """``(figure, axes)`` with the Agg backend; ``axes`` is a list when ``panels > 1``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(width * panels, height))
    return fig, axes


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically and close it; returns the path."""
    import matplotlib.pyplot as plt

    out = Path(path)
    fig.tight_layout()
    with atomic_file(out, "wb") as fh:
        fig.savefig(fh, format="png", dpi=dpi)
    plt.close(fig)
    return out


def plot_training_curves(history: Sequence[dict[str, Any]], path: str | os.PathLike,
                         title: str | None = None, score_label: str = "validation rsum") -> Path:
    """Loss, validation rsum (or ``score_label``: what ``rsum`` holds) and learning rate per epoch
    (``metrics.jsonl`` records) as one PNG.

    The best epoch (highest validation rsum) is marked; the learning rate is on a log scale.
    """
    epochs = [r["epoch"] for r in history]
    fig, (loss_ax, rsum_ax, lr_ax) = new_figure(3, width=4.2, height=3.4)
    loss_ax.plot(epochs, [r["loss"] for r in history], marker="o", markersize=3)
    loss_ax.set_title("training loss (mean per batch)")
    rsum = [r["rsum"] for r in history]
    rsum_ax.plot(epochs, rsum, marker="o", markersize=3, color="tab:green")
    if history:
        best = max(range(len(rsum)), key=lambda k: (rsum[k], -k))
        rsum_ax.plot([epochs[best]], [rsum[best]], "*", markersize=12, color="tab:orange",
                     label=f"best: epoch {epochs[best]}, {rsum[best]:.1f}")
        rsum_ax.legend(fontsize=8)
    rsum_ax.set_title(score_label)
    lr_ax.plot(epochs, [r["lr"] for r in history], marker="o", markersize=3, color="tab:red")
    lr_ax.set_yscale("log")
    lr_ax.set_title("learning rate")
    from matplotlib.ticker import MaxNLocator

    for ax in (loss_ax, rsum_ax, lr_ax):
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def plot_parameters_vs_rsum(rows: Sequence[dict[str, Any]], path: str | os.PathLike,
                            title: str = "parameters vs test rsum") -> Path:
    """Scatter of each run's trainable parameters (log x) against its rsum, labelled by run name.

    ``rows``: dicts with ``name``, ``family``, ``parameters`` and ``rsum``.
    """
    fig, ax = new_figure(1, width=6.5, height=4.5)
    families = sorted({r["family"] for r in rows})
    for family in families:
        mine = [r for r in rows if r["family"] == family]
        ax.scatter([r["parameters"] for r in mine], [r["rsum"] for r in mine], label=family)
        for r in mine:
            ax.annotate(r["name"], (r["parameters"], r["rsum"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("trainable parameters")
    ax.set_ylabel("rsum (R@1+R@5+R@10, both directions)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    return save_figure(fig, path)


def plot_noise_by_family(curves: Sequence[dict[str, Any]], path: str | os.PathLike,
                         title: str = "R@1 under character noise (test split)") -> Path:
    """R@1 against the share of replaced caption characters, one line per entry, i2t and t2i side by side.

    ``curves``: dicts with ``name``, ``ratio`` (list, 0 first) and ``i2t_r1`` / ``t2i_r1`` (lists, percent).
    """
    fig, axes = new_figure(2, width=4.8, height=3.8)
    for ax, direction, label in zip(axes, ("i2t", "t2i"), ("image -> text", "text -> image"), strict=True):
        for c in curves:
            ax.plot([100 * r for r in c["ratio"]], c[f"{direction}_r1"], marker="o", markersize=3,
                    label=c["name"])
        ax.set_xlabel("characters replaced (%)")
        ax.set_ylabel("R@1 (%)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)
