"""Benchmark: time to encode one batch of captions into the joint space, SEAM vs GRU encoders (CPU).

The SEAM paper (section 4.4, figure 6) times a forward pass of a 100-caption batch for captions of
25 to 500 words: SEAM-E encodes 500-word captions in about 1 s, Order Embeddings' GRU takes 16x
longer, and section 4.3 says SEAM is "about 15x faster than the RNN-based methods" (GTX 1080 Ti,
PyTorch). Here: inference (``torch.inference_mode``) on the CPU with a fixed number of threads,
batches of ``--batch`` random captions that all have exactly the given length, a vocabulary of
11,360 words (SEAM table 2). Each encoder maps the words all the way to the joint space:

- ``seam_e`` (h = 30) and ``seam_c`` (h = 5), the defaults, and ``seam_g`` (GRU 512, h = 30), each
  followed by its text projection ``W_t`` (1024 x output_dim, with bias);
- ``gru``: the paper's RNN baseline, the GRU of Order Embeddings (and of the released SEAM code's
  ``gru`` encoder): 300-d words, 1024 units, last state (``uvs_gru`` with ``word_dim=300``);
- ``uvs``: the FNE paper's UVS setting SH: 1024-d words, 1536 units (``uvs_gru``).

One untimed warm-up, then ``--repeats`` timed passes; the table gives the median in seconds and
the speed-up of SEAM-E and SEAM-C over ``gru`` (time of ``gru`` / time of the encoder). ``--clock
cpu`` (the default) times the CPU seconds of this process rather than the wall clock: on a machine
shared with other jobs it is what the encoder itself costs; with one thread on an idle machine the
two agree. The load average is printed before and after.

    .venv/bin/python bench/bench_text_encoders.py                       # 1 thread, 3 repeats
    .venv/bin/python bench/bench_text_encoders.py --threads 2 --lengths 25 100 --encoders seam_e gru
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from train.models import count_parameters, create_text_encoder

VOCAB = 11_360
JOINT = 1024
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}

#: name -> (registered encoder, keywords, text projection into the joint space)
ENCODERS: dict[str, tuple[str, dict, bool]] = {
    "seam_e": ("seam_e", {"hops": 30}, True),
    "seam_c": ("seam_c", {"hops": 5}, True),
    "seam_g": ("seam_g", {"hops": 30, "gru_units": 512}, True),
    "gru": ("uvs_gru", {"d": 1024, "word_dim": 300}, False),
    "uvs": ("uvs_gru", {"d": 1536, "word_dim": 1024}, False),
}


def text_side(name: str) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], int]:
    """The encoder ``name`` of :data:`ENCODERS` followed by its projection, as one function, and its
    number of parameters."""
    registered, kwargs, projected = ENCODERS[name]
    encoder = create_text_encoder(registered, VOCAB, **kwargs).eval()
    projection = nn.Linear(encoder.output_dim, JOINT, bias=True) if projected else nn.Identity()

    def encode(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return projection(encoder(tokens, lengths))

    return encode, count_parameters(encoder) + count_parameters(projection)


def time_encoder(encode: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], batch: int, words: int,
                 repeats: int, clock: Callable[[], float] = time.process_time) -> float:
    """Median seconds (of ``clock``) of ``repeats`` forward passes over ``batch`` random captions of
    ``words`` words."""
    gen = torch.Generator().manual_seed(words)
    tokens = torch.randint(2, VOCAB, (batch, words), generator=gen)
    lengths = torch.full((batch,), words, dtype=torch.long)
    times = []
    with torch.inference_mode():
        encode(tokens, lengths)  # warm-up: allocations, first-call dispatch
        for _ in range(repeats):
            start = clock()
            encode(tokens, lengths)
            times.append(clock() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoders", nargs="+", choices=sorted(ENCODERS),
                        default=["seam_e", "seam_c", "seam_g", "gru", "uvs"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[25, 50, 100, 200, 500])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per cell (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: CPU seconds of this process (robust to other jobs); wall: elapsed time")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, "
          f"batch {args.batch}, median of {args.repeats} ({args.clock} clock), "
          f"load before {os.getloadavg()[0]:.2f}")
    built = {name: text_side(name) for name in args.encoders}
    encoders = {name: encode for name, (encode, _) in built.items()}
    print("text-side parameters: " + ", ".join(f"{name} {n:,}" for name, (_, n) in built.items()))
    speedups = [name for name in ("seam_e", "seam_c") if name in encoders and "gru" in encoders]
    header = f"{'words':>5} " + " ".join(f"{name + ' s':>9}" for name in encoders)
    header += "".join(f" {'gru/' + name[-1].upper():>7}" for name in speedups)
    print(header)
    for words in args.lengths:
        seconds = {name: time_encoder(encode, args.batch, words, args.repeats, CLOCKS[args.clock])
                   for name, encode in encoders.items()}
        line = f"{words:>5} " + " ".join(f"{seconds[name]:>9.4f}" for name in encoders)
        line += "".join(f" {seconds['gru'] / seconds[name]:>6.1f}x" for name in speedups)
        print(line, flush=True)
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
