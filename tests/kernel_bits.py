"""Which CPU kernels a set of environment variables changes, seen in the bits of a few float32 results.

    python tests/kernel_bits.py "" ATEN_CPU_CAPABILITY=default "MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41"

Each argument is a kernel set (``VAR=VALUE`` words; ``""`` is the machine's native choice). Each set runs
in its own process (the libraries read these variables when they load) with one thread, on the same
inputs (from NumPy, since ``torch.randn`` is itself an ATen kernel), and prints a digest of each result:
a matrix product and a linear layer (MKL's sgemm), 1-D, 2-D and depthwise convolutions (oneDNN), a sum,
a softmax, an exp and ``torch.randn`` (ATen's own vectorised kernels). Every set after the first also
lists the results whose bits differ from the first set's. ``make test-kernels`` prints this table
before it runs the suite under each set; ``docs/reproducibility.md`` explains the sets.

Exit status 1 when a set after the first changes no bits: on this CPU it is the first set again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys


def digests() -> dict[str, str]:
    """Digest of each probe's float32 result under this process's kernels."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)

    def t(*shape: int) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))

    def h(x: torch.Tensor) -> str:
        return hashlib.sha256(x.detach().contiguous().numpy().tobytes()).hexdigest()[:8]

    out = {
        "matmul": h(t(513, 1027) @ t(1027, 257)),
        "linear": h(F.linear(t(128, 512), t(512, 512), t(512))),
        "conv1d": h(F.conv1d(t(8, 64, 200), t(96, 64, 3), t(96))),
        "conv2d": h(F.conv2d(t(4, 32, 56, 56), t(48, 32, 3, 3), t(48), padding=1)),
        "dwconv": h(F.conv2d(t(4, 32, 56, 56), t(32, 1, 3, 3), groups=32, padding=1)),
        "sum": h(t(1_000_003).sum()),
        "softmax": h(torch.softmax(t(257, 1031), 1)),
        "exp": h(torch.exp(t(257, 1031))),
    }
    torch.manual_seed(0)
    out["randn"] = h(torch.randn(1000))
    out["aten"] = torch.backends.cpu.get_cpu_capability()
    return out


def main(sets: list[str]) -> int:
    if not sets:
        sets = [""]
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_",
                                 "DNNL_"))}
    base.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    first: dict[str, str] = {}
    same = []
    for i, kernel_set in enumerate(sets):
        env = dict(base, **dict(word.split("=", 1) for word in kernel_set.split()))
        result = json.loads(subprocess.run([sys.executable, __file__, "--child"], env=env, check=True,
                                           capture_output=True, text=True).stdout)
        name = kernel_set or "native"
        line = " ".join(f"{k}={v}" for k, v in result.items() if k != "aten")
        if i == 0:
            first = result
            print(f"{name} (ATen {result['aten']}): {line}")
            continue
        changed = [k for k in result if k != "aten" and result[k] != first[k]]
        print(f"{name} (ATen {result['aten']}): "
              + (f"other bits than {sets[0] or 'native'} in {', '.join(changed)}" if changed
                 else f"the same bits as {sets[0] or 'native'}: no other kernels on this CPU"))
        if not changed:
            same.append(name)
    return 1 if same else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(digests()))
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
