"""The evaluator compiles its order kernel into an inductor cache folder of its own kernel set
(vsecore.inductor_cache): a kernel compiled under another set (scalar code under ATEN_CPU_CAPABILITY=default,
another thread count, another CPU) is never loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vsecore.inductor_cache import (
    KERNEL_VARIABLES,
    PREFIX,
    kernel_set_cache,
    kernel_set_key,
    use_kernel_set_cache,
)

ROOT = Path(__file__).resolve().parents[1]


def child(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter (torch reads the kernel-set variables when it loads) with the
    kernel-set variables unset except those of ``env``; its last line of output."""
    drop = (*KERNEL_VARIABLES, "TORCHINDUCTOR_CACHE_DIR")
    environ = {k: v for k, v in os.environ.items() if k not in drop}
    environ.update(env, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_another_kernel_set_or_thread_count_is_another_folder() -> None:
    code = "import torch; from vsecore.inductor_cache import kernel_set_key; print(kernel_set_key())"
    native = child(code)
    scalar = child(code, ATEN_CPU_CAPABILITY="default")
    assert native != scalar and scalar.startswith("novec-")
    assert child(code) == native  # the same set: the same folder, so a warm cache stays warm
    assert child(code, MKL_CBWR="COMPATIBLE") != native


def test_the_folder_is_under_the_users_cache_and_re_keyed_when_inherited(tmp_path) -> None:
    key = kernel_set_key({})
    assert kernel_set_cache({"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}) == str(tmp_path / f"{PREFIX}{key}")
    # a child process inherits its parent's folder: it goes back to the user's cache and keys its own set
    inherited = str(tmp_path / f"{PREFIX}novec-t1-000000000000")
    assert kernel_set_cache({"TORCHINDUCTOR_CACHE_DIR": inherited}) == str(tmp_path / f"{PREFIX}{key}")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert kernel_set_cache({}) == str(Path(default_cache_dir()).absolute() / f"{PREFIX}{key}")
    environ = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    assert use_kernel_set_cache(environ) == environ["TORCHINDUCTOR_CACHE_DIR"] == kernel_set_cache(environ)
    assert use_kernel_set_cache(environ) == environ["TORCHINDUCTOR_CACHE_DIR"]  # idempotent


def test_the_thread_count_is_part_of_the_key() -> None:
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel_set_key({})
        torch.set_num_threads(2)
        two = kernel_set_key({})
    finally:
        torch.set_num_threads(threads)
    assert one != two and "-t1-" in one and "-t2-" in two


COMPILE = """
import json, os, torch
from train.engine.similarity import order_violation
from train.retrieval.evaluate.order_kernel import OrderKernel
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
images, captions = torch.rand(30, 64, generator=gen), torch.rand(70, 64, generator=gen)
kernel = OrderKernel()
out = order_violation(images, captions, fused=True, squared=kernel.squared_violation)
ref = order_violation(images, captions, fused=False)
print(json.dumps({"backend": kernel.backend, "folder": os.environ["TORCHINDUCTOR_CACHE_DIR"],
                  "close": bool(torch.allclose(out, ref, rtol=1e-5, atol=1e-5))}))
"""


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("VSE_TEST_COMPILE", "1") == "0", reason="VSE_TEST_COMPILE=0")
def test_a_kernel_compiled_under_another_set_is_not_loaded(tmp_path) -> None:
    """Before, both processes shared ``tmp_path``: the native one loaded the scalar kernel (65 times slower
    on a 1,000 x 5,000 tile), and an AVX-512 kernel loaded under avx2 computed wrong scores."""
    runs = [json.loads(child(COMPILE, TORCHINDUCTOR_CACHE_DIR=str(tmp_path), **env))
            for env in ({"ATEN_CPU_CAPABILITY": "default"}, {})]
    if any(r["backend"] != "compiled" for r in runs):
        pytest.skip("torch.compile cannot build here")
    assert all(r["close"] for r in runs)
    folders = [Path(r["folder"]) for r in runs]
    assert folders[0] != folders[1] and all(f.parent == tmp_path and f.is_dir() for f in folders)
    assert all((f / "fxgraph").is_dir() for f in folders)
    # beside them only inductor's probes of the vector ISA (which the key asks for), no compiled graph
    assert not (tmp_path / "fxgraph").exists() and not (tmp_path / "aotautograd").exists()
