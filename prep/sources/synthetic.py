"""The embedded ``synthetic`` dataset: coloured shapes on a plain background, described in en, de and ja.

Each image holds one or two big, flat-coloured shapes (6 colours x 4 kinds x 2 sizes, at one of
five positions, or side by side / one above the other). Every caption says what is drawn: colour,
kind, size and position, with five different templates per language, so the five captions of an
image differ in wording but not in content. Few colours and kinds make combinations recur, which
is what lets a small character-level model learn it from generic ImageNet CNN features in minutes.
Japanese captions are written in kana/kanji and transliterated by ``prep`` like YJ Captions.
The templates are translations of one another, so each image also gives five cross-language ``pairs``
(template ``k`` in every language), the aligned sentences of the LIWE paper's cross-language loss.
Deterministic given the seed; images are PNG files under ``images/`` of the output folder.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from prep.sources import RawCaption, RawDataset, RawImage, RawPair
from vsecore.console import progress
from vsecore.errors import UserError

# colour: (RGB, English, German (declinable stem or None when indeclinable), German plain, Japanese
# attributive, Japanese noun)
COLOURS = {
    "red": ((220, 30, 30), "red", "rot", "rot", "赤い", "赤"),
    "green": ((30, 160, 50), "green", "grün", "grün", "緑の", "緑"),
    "blue": ((30, 60, 220), "blue", "blau", "blau", "青い", "青"),
    "yellow": ((240, 200, 0), "yellow", "gelb", "gelb", "黄色い", "黄色"),
    "black": ((20, 20, 20), "black", "schwarz", "schwarz", "黒い", "黒"),
    "purple": ((140, 40, 180), "purple", None, "lila", "紫の", "紫"),
}
# kind: (English, German noun, German gender, Japanese)
SHAPES = {
    "circle": ("circle", "Kreis", "m", "丸"),
    "square": ("square", "Quadrat", "n", "四角"),
    "triangle": ("triangle", "Dreieck", "n", "三角"),
    "cross": ("cross", "Kreuz", "n", "十字"),
}
SIZES = {"big": ("big", "groß", "大きな", 0.30), "small": ("small", "klein", "小さな", 0.17)}
# position: (centre x, centre y as fractions, English phrase, German phrase, Japanese place noun)
POSITIONS = {
    "left": (0.27, 0.5, "on the left", "links", "左"),
    "right": (0.73, 0.5, "on the right", "rechts", "右"),
    "top": (0.5, 0.27, "at the top", "oben", "上"),
    "bottom": (0.5, 0.73, "at the bottom", "unten", "下"),
    "centre": (0.5, 0.5, "in the middle", "in der Mitte", "真ん中"),
}
BACKGROUND = (225, 225, 225)
LANGUAGES = ("en", "de", "ja")


@dataclass(frozen=True)
class Shape:
    """One drawn shape: what the captions name."""

    colour: str
    kind: str
    size: str
    position: str


def _draw(draw: ImageDraw.ImageDraw, s: Shape, side: int, rng: random.Random) -> None:
    cx, cy = POSITIONS[s.position][:2]
    r = SIZES[s.size][3] * side * rng.uniform(0.9, 1.05)
    x = cx * side + rng.uniform(-0.04, 0.04) * side
    y = cy * side + rng.uniform(-0.04, 0.04) * side
    fill = COLOURS[s.colour][0]
    if s.kind == "circle":
        draw.ellipse([x - r, y - r, x + r, y + r], fill=fill)
    elif s.kind == "square":
        h = r * 0.85
        draw.rectangle([x - h, y - h, x + h, y + h], fill=fill)
    elif s.kind == "triangle":
        draw.polygon([(x, y - r), (x - r, y + 0.8 * r), (x + r, y + 0.8 * r)], fill=fill)
    else:
        w = r * 0.32
        draw.rectangle([x - r, y - w, x + r, y + w], fill=fill)
        draw.rectangle([x - w, y - r, x + w, y + r], fill=fill)


def _de_np(s: Shape, accusative: bool = False, with_size: bool = True) -> str:
    """German indefinite noun phrase, declined (strong adjective endings after 'ein')."""
    noun, gender = SHAPES[s.kind][1:3]
    stem, plain = COLOURS[s.colour][2:4]
    masc = gender == "m"
    ending = ("en" if accusative else "er") if masc else "es"
    art = ("einen" if accusative else "ein") if masc else "ein"
    colour = stem + ending if stem else plain
    size = SIZES[s.size][1] + ending
    return f"{art} {size + ' ' if with_size else ''}{colour} {noun}"


def _cap(text: str) -> str:
    """Upper-case the first letter only (``str.capitalize`` would lower-case German nouns)."""
    return text[:1].upper() + text[1:]


def _en_np(s: Shape, with_size: bool = True) -> str:
    size = SIZES[s.size][0]
    return f"a {size + ' ' if with_size else ''}{COLOURS[s.colour][1]} {SHAPES[s.kind][0]}"


def _ja_np(s: Shape, with_size: bool = True) -> str:
    return f"{SIZES[s.size][2] if with_size else ''}{COLOURS[s.colour][4]}{SHAPES[s.kind][3]}"


def captions_one(s: Shape) -> dict[str, list[str]]:
    """Five captions per language of an image with one shape."""
    en_pos, de_pos, ja_pos = POSITIONS[s.position][2:]
    return {
        "en": [f"{_en_np(s)} {en_pos}.", f"there is {_en_np(s)} {en_pos} of the picture.",
               f"{_en_np(s, False)} {en_pos} on a grey background.",
               f"one {SHAPES[s.kind][0]}, {SIZES[s.size][0]} and {COLOURS[s.colour][1]}, {en_pos}.",
               f"the image shows {_en_np(s)} {en_pos}."],
        "de": [_cap(f"{_de_np(s)} {de_pos}."), f"Es gibt {_de_np(s, True)} {de_pos} im Bild.",
               _cap(f"{_de_np(s, False, False)} {de_pos} auf grauem Hintergrund."),
               f"Ein {SHAPES[s.kind][1]}, {SIZES[s.size][1]} und {COLOURS[s.colour][3]}, {de_pos}.",
               f"Das Bild zeigt {_de_np(s, True)} {de_pos}."],
        "ja": [f"{ja_pos}に{_ja_np(s)}があります。", f"{_ja_np(s)}が{ja_pos}にあります。",
               f"灰色の背景の{ja_pos}に{_ja_np(s, False)}。",
               f"{SIZES[s.size][2]}{SHAPES[s.kind][3]}は{COLOURS[s.colour][5]}で、{ja_pos}にあります。",
               f"画像の{ja_pos}に{_ja_np(s)}が描かれています。"],
    }


def captions_two(a: Shape, b: Shape) -> dict[str, list[str]]:
    """Five captions per language of an image with two shapes (``a`` left/top, ``b`` right/bottom)."""
    en_a, en_b = POSITIONS[a.position][2], POSITIONS[b.position][2]
    de_a, de_b = POSITIONS[a.position][3], POSITIONS[b.position][3]
    ja_a, ja_b = POSITIONS[a.position][4], POSITIONS[b.position][4]
    rel_en = "to the right of" if b.position == "right" else "below"
    rel_ja = "右" if b.position == "right" else "下"
    return {
        "en": [f"{_en_np(a)} {en_a} and {_en_np(b)} {en_b}.", f"{_en_np(b)} {rel_en} {_en_np(a)}.",
               f"two shapes: {_en_np(a, False)} and {_en_np(b, False)}.",
               f"there is {_en_np(a)} {en_a}, and {_en_np(b)} {en_b}.",
               f"the picture shows {_en_np(a)} {en_a} and {_en_np(b)} {en_b}."],
        "de": [_cap(f"{_de_np(a)} {de_a} und {_de_np(b)} {de_b}."),
               _cap(f"{_de_np(b)} {de_b}, {_de_np(a)} {de_a}."),
               f"Zwei Formen: {_de_np(a, False, False)} und {_de_np(b, False, False)}.",
               f"Es gibt {_de_np(a, True)} {de_a} und {_de_np(b, True)} {de_b}.",
               f"Das Bild zeigt {_de_np(a, True)} {de_a} und {_de_np(b, True)} {de_b}."],
        "ja": [f"{ja_a}に{_ja_np(a)}、{ja_b}に{_ja_np(b)}があります。",
               f"{_ja_np(a)}の{rel_ja}に{_ja_np(b)}があります。",
               f"{_ja_np(a, False)}と{_ja_np(b, False)}の二つの図形。",
               f"{_ja_np(b)}が{ja_b}に、{_ja_np(a)}が{ja_a}にあります。",
               f"画像には{ja_a}に{_ja_np(a)}と{ja_b}に{_ja_np(b)}が描かれています。"],
    }


def _random_scene(rng: random.Random) -> list[Shape]:
    def pick(position: str) -> Shape:
        return Shape(rng.choice(list(COLOURS)), rng.choice(list(SHAPES)), rng.choice(list(SIZES)), position)

    if rng.random() < 0.5:
        return [pick(rng.choice(list(POSITIONS)))]
    first, second = ("left", "right") if rng.random() < 0.5 else ("top", "bottom")
    a, b = pick(first), pick(second)
    while (a.colour, a.kind) == (b.colour, b.kind):  # two identical shapes would make captions odd
        b = pick(second)
    return [a, b]


def split_sizes(num_images: int) -> tuple[int, int, int]:
    """Train/val/test sizes: 1/12 each for val and test (100/100 of 1,200), the rest train."""
    if num_images < 3:
        raise UserError(f"--num-images must be at least 3 (one per split), got {num_images}")
    held = max(1, num_images // 12)
    return num_images - 2 * held, held, held


def generate_synthetic(out_dir: Path, num_images: int, image_size: int, captions_per_image: int,
                       languages: list[str], seed: int) -> RawDataset:
    """Draw the images into ``out_dir/images`` and return their captions (deterministic in ``seed``)."""
    unknown = sorted(set(languages) - set(LANGUAGES))
    if unknown or not languages:
        raise UserError(f"synthetic: unsupported languages {unknown or languages} (choose from en, de, ja)")
    if not 1 <= captions_per_image <= 5:
        raise UserError(f"synthetic: --captions-per-image must be 1..5, got {captions_per_image}")
    if image_size < 32:
        raise UserError(f"synthetic: --image-size must be at least 32, got {image_size}")
    n_train, n_val, _ = split_sizes(num_images)
    rng = random.Random(seed)
    images_dir = out_dir / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    out: list[RawImage] = []
    pairs: list[RawPair] = []
    for i in progress(range(num_images), desc="synthetic images", unit="img"):
        scene = _random_scene(rng)
        img = Image.new("RGB", (image_size, image_size), BACKGROUND)
        draw = ImageDraw.Draw(img)
        for shape in scene:
            _draw(draw, shape, image_size, rng)
        name = f"synthetic_{i:06d}.png"
        img.save(images_dir / name, optimize=False, compress_level=1)
        texts = captions_one(scene[0]) if len(scene) == 1 else captions_two(*scene)
        split = "train" if i < n_train else ("val" if i < n_train + n_val else "test")
        captions = []
        for lang in languages:
            order = list(range(5))
            rng.shuffle(order)  # which templates an image gets (when fewer than 5) and their order
            captions += [RawCaption(lang, texts[lang][k]) for k in order[:captions_per_image]]
        out.append(RawImage(key=name, split=split, filename=name, filepath="images", captions=captions,
                            where=f"synthetic image {i}"))
        if len(languages) > 1:  # template k says the same thing in every language
            pairs += [RawPair(image_key=name, sides={lang: texts[lang][k] for lang in languages},
                              where=f"synthetic image {i}, template {k}") for k in range(5)]
    return RawDataset(name="synthetic", languages=list(languages), images=out, images_root=out_dir,
                      inputs=[], notes={"seed": seed}, pairs=pairs)
