"""A ``torch.compile`` (inductor) cache folder of this process's own kernel set.

Inductor's on-disk caches do not tell kernel sets apart. A kernel compiled under one set is loaded by a
process that would have compiled another one:

- under ``ATEN_CPU_CAPABILITY=default`` inductor emits scalar C++; a later process of the CPU's own kernels
  that shares the cache loaded it and ranked a 1,000 x 5,000 order-violation tile in 16 s instead of
  0.24 s (AMD EPYC Zen 4, 2 threads, 2026-11-26), and took 282 s instead of 6.8 s for seam's COCO-5k
  ranking in bench_scale;
- a kernel compiled for AVX-512 with one thread, loaded under ``ATEN_CPU_CAPABILITY=avx2``, computed wrong
  scores (``docs/reproducibility.md``);
- a cache shared by machines of different CPUs (a home folder on a cluster) can hold code for
  instructions the other CPU lacks;
- inductor writes the thread count into its parallel loops.

:func:`kernel_set_key` names what a compiled CPU kernel depends on beyond its source, and
:func:`use_kernel_set_cache` points ``TORCHINDUCTOR_CACHE_DIR`` at ``<cache>/vse-kernels-<key>`` (``<cache>``:
the variable as the user set it, else inductor's default folder) before the toolkit compiles.
"""

from __future__ import annotations

import hashlib
import os
import platform
from collections.abc import MutableMapping
from pathlib import Path

#: the subfolders of an inductor cache that :func:`use_kernel_set_cache` makes start with this
PREFIX = "vse-kernels-"
#: the variables that make ATen, MKL and oneDNN run another CPU's kernels (a "kernel set",
#: ``docs/reproducibility.md``; the Makefile's ``KERNEL_VARS``)
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                    "DNNL_MAX_CPU_ISA")


def cpu_flags() -> str:
    """The CPU's instruction-set flags (``/proc/cpuinfo``'s first ``flags`` line), else its name."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def vector_isa() -> str:
    """The vector instruction set inductor compiles CPU kernels for (``ATEN_CPU_CAPABILITY`` lowers it):
    ``avx512``, ``avx2``, ... or ``novec``; ``unknown`` where torch does not say."""
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        name = "_".join(str(pick_vec_isa()).split())
        return "novec" if not name or "INVALID" in name.upper() else name
    except Exception:  # noqa: BLE001 - a private API: its absence must not stop a compilation
        return "unknown"


def kernel_set_key(environ: MutableMapping[str, str] = os.environ) -> str:
    """``<vector ISA>-t<threads>-<12 hex digits>``: the digest covers the ISA, the thread count, the CPU's
    flags and the :data:`KERNEL_VARIABLES`."""
    import torch

    isa, threads = vector_isa(), torch.get_num_threads()
    variables = [f"{name}={environ.get(name, '')}" for name in KERNEL_VARIABLES]
    parts = [isa, str(threads), cpu_flags(), *variables]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    return f"{isa}-t{threads}-{digest}"


def kernel_set_cache(environ: MutableMapping[str, str] = os.environ) -> str:
    """The folder of this process's kernel set: ``<cache>/vse-kernels-<key>``, where ``<cache>`` is
    ``TORCHINDUCTOR_CACHE_DIR`` (or its parent when it already names such a folder, e.g. inherited from a
    parent process of another kernel set), else inductor's default folder."""
    base = environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not base:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        base = default_cache_dir()
    path = Path(base).absolute()
    if path.name.startswith(PREFIX):
        path = path.parent
    return str(path / f"{PREFIX}{kernel_set_key(environ)}")


def use_kernel_set_cache(environ: MutableMapping[str, str] = os.environ) -> str:
    """Point ``TORCHINDUCTOR_CACHE_DIR`` at :func:`kernel_set_cache` (for this process and its children,
    which re-key it for their own set); returns the folder. Call it before ``torch.compile`` compiles."""
    folder = kernel_set_cache(environ)
    environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder
