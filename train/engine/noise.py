"""Character noise (CHAIN-VSE section 4.3): the ratios of ``--noise START:STOP:STEP``, the alphabet the
replacements are drawn from, and the noisy texts. Task-agnostic: the retrieval analysis
(:mod:`train.retrieval.evaluate.analysis`) and the classification one (:mod:`train.classification.evaluate`)
both draw from here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vsecore.errors import UserError
from vsecore.jsonfile import read_json


def parse_ratio_range(spec: str) -> list[float]:
    """``"start:stop:step"`` (stop included) or a comma list -> ratios in [0, 1]; e.g. 0.01:0.25:0.01."""
    try:
        if ":" in spec:
            start, stop, step = (float(p) for p in spec.split(":"))
            if step <= 0 or stop < start:
                raise ValueError
            count = int(math.floor((stop - start) / step + 1e-9)) + 1
            ratios = [round(start + k * step, 10) for k in range(count)]
        else:
            ratios = [float(p) for p in spec.split(",") if p.strip()]
    except ValueError:
        raise UserError(f"--noise {spec!r}: expected START:STOP:STEP (e.g. 0.01:0.25:0.01) or a comma "
                        "list of ratios") from None
    if not ratios or any(not 0.0 < r <= 1.0 for r in ratios):
        raise UserError(f"--noise {spec!r}: ratios must lie in (0, 1]")
    return ratios


def caption_alphabet(texts: Sequence[str]) -> list[str]:
    """The distinct characters of the captions, sorted (the default replacement alphabet)."""
    return sorted(set("".join(texts)))


def alphabet_from_chars_json(path: str | Path) -> list[str]:
    """Single-character symbols of a prepared ``chars.json`` (padding and unknown left out)."""
    data = read_json(path, "a prepared chars.json", kind=dict)
    skip = {data.get("pad"), data.get("unk")}
    return [s for s in data["symbols"] if s not in skip and len(s) == 1]


def add_character_noise(texts: Sequence[str], ratio: float, alphabet: Sequence[str],
                        rng: np.random.Generator) -> list[str]:
    """Replace ``max(1, round(ratio * len))`` characters of each text by different alphabet characters.

    Positions are distinct; a replacement never equals the character it replaces. Empty texts
    stay empty.
    """
    symbols = list(dict.fromkeys(alphabet))
    if len(symbols) < 2:
        raise UserError("the noise alphabet needs at least two distinct characters")
    index = {ch: k for k, ch in enumerate(symbols)}
    noisy = []
    for text in texts:
        length = len(text)
        if length == 0:
            noisy.append(text)
            continue
        n_changed = min(length, max(1, int(math.floor(ratio * length + 0.5))))
        positions = np.argsort(rng.random(length))[:n_changed]
        draws = rng.integers(0, len(symbols) - 1, size=n_changed)
        chars = list(text)
        for pos, draw in zip(positions.tolist(), draws.tolist(), strict=True):
            current = index.get(chars[pos])
            # draw from the alphabet without the current character: skip over its index
            if current is not None and draw >= current:
                draw += 1
            elif current is None:
                draw = int(rng.integers(0, len(symbols)))
            chars[pos] = symbols[draw]
        noisy.append("".join(chars))
    return noisy


def training_noise(texts: Sequence[str], indices: Sequence[int], ratio: float, alphabet: Sequence[str],
                   seed: int, epoch: int) -> list[str]:
    """Texts ``indices`` of a training set with :func:`add_character_noise` at ``ratio`` (``--train-noise``).

    Each text's draw is seeded by ``(seed, epoch, index)`` alone: fresh every epoch, and the same whatever
    the batch, its order, the workers or a resume in the middle of the epoch.
    """
    out = []
    for k in indices:
        rng = np.random.default_rng([seed, epoch, int(k)])
        out.extend(add_character_noise([texts[int(k)]], ratio, alphabet, rng))
    return out
