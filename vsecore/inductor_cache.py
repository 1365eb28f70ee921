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
:func:`use_kernel_set_cache` points ``TORCHINDUCTOR_CACHE_DIR`` at ``<cache>/vse-kernels-<key>`` before the
toolkit compiles. ``<cache>`` (:func:`cache_root`) is the variable as the user set it, else
``$XDG_CACHE_HOME/vse-toolkit/inductor`` (``~/.cache/...``), never inductor's own default
``/tmp/torchinductor_<user>``: a predictable folder in ``/tmp`` that another user could create first and
fill with code. A compiled kernel is code, so these folders follow :mod:`vsecore.trusted`: they are checked
(:func:`vsecore.trusted.trusted_folder`) before use and hold their content to a manifest
(:func:`vsecore.trusted.verified_cache`), and so does the folder of inductor's vector-ISA probes, which
loads the libraries it builds (:func:`vector_isa`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
from collections.abc import Iterator, Mapping, MutableMapping
from pathlib import Path

from vsecore.trusted import trusted_folder, verified_cache

#: the subfolders of an inductor cache that :func:`use_kernel_set_cache` makes start with this
PREFIX = "vse-kernels-"
#: the subfolder of an inductor cache where :func:`vector_isa` lets inductor build and load its ISA probes
PROBES = "vse-isa-probes"
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


def cache_home(environ: Mapping[str, str] = os.environ) -> Path:
    """The user's cache folder: ``$XDG_CACHE_HOME`` when it is an absolute path, else ``~/.cache``."""
    xdg = environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg)
    home = environ.get("HOME", "")
    return (Path(home) if os.path.isabs(home) else Path.home()) / ".cache"


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the kernel-set folders go: ``TORCHINDUCTOR_CACHE_DIR`` (or its parent when it already names one
    of them, e.g. inherited from a parent process of another kernel set), else
    ``<cache home>/vse-toolkit/inductor``; an absolute path, not yet checked."""
    base = environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not base:
        return cache_home(environ) / "vse-toolkit" / "inductor"
    path = Path(os.path.abspath(base))
    return path.parent if path.name.startswith(PREFIX) or path.name == PROBES else path


@contextlib.contextmanager
def _inductor_cache_at(folder: Path) -> Iterator[None]:
    """Point inductor's cache at ``folder`` while the block runs (inductor reads the variable at each use)."""
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def _isa_name() -> str:
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        name = "_".join(str(pick_vec_isa()).split())
        return "novec" if not name or "INVALID" in name.upper() else name
    except Exception:  # noqa: BLE001 - a private API: its absence must not stop a compilation
        return "unknown"


def _probed() -> bool:
    """Whether inductor has probed the vector ISAs in this process already (it does so once)."""
    try:
        from torch._inductor.cpu_vec_isa import valid_vec_isa_list
    except Exception:  # noqa: BLE001 - nothing to probe with
        return True
    info = getattr(valid_vec_isa_list, "cache_info", None)
    return info is not None and info().currsize > 0


def vector_isa(root: str | os.PathLike | None = None) -> str:
    """The vector instruction set inductor compiles CPU kernels for (``ATEN_CPU_CAPABILITY`` lowers it):
    ``avx512``, ``avx2``, ... or ``novec``; ``unknown`` where torch does not say.

    Inductor finds it by building a small library per ISA and loading it in a child process, into its
    cache folder; the first call of a process lets it do so in ``<root>/vse-isa-probes`` (``root``: default
    :func:`cache_root`) under :func:`vsecore.trusted.verified_cache`, so that no planted library is
    loaded. :class:`vsecore.trusted.UntrustedFolderError` when that folder fails the check."""
    if _probed():
        return _isa_name()
    root = Path(root) if root is not None else cache_root()
    with verified_cache(root / PROBES, "vector-ISA probes") as folder, _inductor_cache_at(folder):
        return _isa_name()


def kernel_set_key(environ: MutableMapping[str, str] = os.environ) -> str:
    """``<vector ISA>-t<threads>-<12 hex digits>``: the digest covers the ISA, the thread count, the CPU's
    flags and the :data:`KERNEL_VARIABLES`. The first call of a process may probe the ISA
    (:func:`vector_isa`, under :func:`cache_root`)."""
    import torch

    isa, threads = vector_isa(cache_root(environ)), torch.get_num_threads()
    variables = [f"{name}={environ.get(name, '')}" for name in KERNEL_VARIABLES]
    parts = [isa, str(threads), cpu_flags(), *variables]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    return f"{isa}-t{threads}-{digest}"


def kernel_set_cache(environ: MutableMapping[str, str] = os.environ) -> str:
    """The folder of this process's kernel set, not yet checked: ``<cache>/vse-kernels-<key>``, where
    ``<cache>`` is :func:`cache_root`."""
    return str(cache_root(environ) / f"{PREFIX}{kernel_set_key(environ)}")


def use_kernel_set_cache(environ: MutableMapping[str, str] = os.environ) -> str:
    """Point ``TORCHINDUCTOR_CACHE_DIR`` at :func:`kernel_set_cache` (for this process and its children,
    which re-key it for their own set) once it and the folder above it pass
    :func:`vsecore.trusted.trusted_folder` (made 0700 where missing); returns its real path, which the
    variable then names. :class:`vsecore.trusted.UntrustedFolderError` when a check fails. Call it before
    ``torch.compile`` compiles, and compile under :func:`vsecore.trusted.verified_cache` of the folder."""
    wanted = Path(kernel_set_cache(environ))
    folder = str(trusted_folder(trusted_folder(wanted.parent) / wanted.name))
    environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder
