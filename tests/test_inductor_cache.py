"""The evaluator compiles its order kernel into an inductor cache folder of its own kernel set
(vsecore.inductor_cache): a kernel compiled under another set (scalar code under ATEN_CPU_CAPABILITY=default,
another thread count, another CPU) is never loaded. A compiled kernel is code: the folder is the user's own,
checked before use, and its content is verified against a manifest (vsecore.trusted), so a line planted in a
cached module never runs (issue 41)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from train.engine.similarity import order_violation
from train.retrieval.evaluate.order_kernel import OrderKernel
from vsecore.inductor_cache import (
    KERNEL_VARIABLES,
    PREFIX,
    PROBES,
    cache_root,
    kernel_set_cache,
    kernel_set_key,
    use_kernel_set_cache,
)
from vsecore.trusted import (
    UntrustedFolderError,
    clear_folder,
    content_problem,
    manifest_path,
    trusted_folder,
    verified_cache,
)

ROOT = Path(__file__).resolve().parents[1]
#: a uid that owns nothing here (the tests that give a folder to another user need root)
STRANGER = 12345


def need_root(kind: str) -> None:
    """Skip unless root: only root can give a folder to another user or group."""
    if ("stranger" in kind or kind == "group-writable") and os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")


def run_child(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (torch reads the kernel-set variables when it loads) with the
    kernel-set variables unset except those of ``env``; fails the test unless it exits 0."""
    drop = (*KERNEL_VARIABLES, "TORCHINDUCTOR_CACHE_DIR")
    environ = {k: v for k, v in os.environ.items() if k not in drop}
    environ.update(env, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def child(code: str, **env: str) -> str:
    """:func:`run_child`'s last line of output."""
    return run_child(code, **env).stdout.strip().splitlines()[-1]


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
    for name in (f"{PREFIX}novec-t1-000000000000", PROBES):
        inherited = str(tmp_path / name)
        assert kernel_set_cache({"TORCHINDUCTOR_CACHE_DIR": inherited}) == str(tmp_path / f"{PREFIX}{key}")
    # not inductor's default /tmp/torchinductor_<user>: the user's cache home
    assert kernel_set_cache({}) == str(Path.home() / ".cache/vse-toolkit/inductor" / f"{PREFIX}{key}")
    xdg = {"XDG_CACHE_HOME": str(tmp_path), "HOME": "/nowhere"}
    assert cache_root(xdg) == tmp_path / "vse-toolkit/inductor"
    relative = {"XDG_CACHE_HOME": "relative", "HOME": str(tmp_path)}  # not absolute: ignored, as XDG says
    assert cache_root(relative) == tmp_path / ".cache/vse-toolkit/inductor"
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
    # beside them only the folder of inductor's probes of the vector ISA (which the key asks for) and their
    # manifests and locks: no compiled graph, no probe outside a verified folder
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(
        [PROBES, *(f.name for f in folders)])
    for folder in (*folders, tmp_path / PROBES):
        assert manifest_path(folder).is_file() and content_problem(folder) is None


# -- the trusted-folder check -------------------------------------------------------------------------------
def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_missing_folder_is_made_0700_and_its_real_path_returned(tmp_path) -> None:
    folder = trusted_folder(tmp_path / "a" / "b" / "c")
    assert folder == tmp_path / "a" / "b" / "c" and folder.is_dir()
    assert all(mode(p) == 0o700 for p in (tmp_path / "a", tmp_path / "a" / "b", folder))
    # a link above the folder is resolved: the caller goes on with the real path, which a link swapped
    # later cannot redirect
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert trusted_folder(tmp_path / "link" / "cache") == tmp_path / "real" / "cache"
    # a folder of ours that others may read (not write) is made private rather than refused
    (tmp_path / "readable").mkdir(mode=0o755)
    os.chmod(tmp_path / "readable", 0o755)
    assert trusted_folder(tmp_path / "readable", create=False) and mode(tmp_path / "readable") == 0o700
    # a sticky folder that anyone may write (/tmp) may be above it
    os.chmod(tmp_path / "a", 0o1777)
    assert trusted_folder(tmp_path / "a" / "b" / "c") == folder


def test_a_group_of_ones_own_may_write(tmp_path) -> None:
    """Under ``umask 002`` every folder is group-writable; a user-private group (named as us, no other
    member) lets nobody else write, so such folders are not refused."""
    import grp
    import pwd

    me, group = pwd.getpwuid(os.geteuid()).pw_name, grp.getgrgid(os.getegid())
    if group.gr_name != me or set(group.gr_mem) - {me}:
        pytest.skip(f"the primary group {group.gr_name} is not a user-private group")
    (tmp_path / "shared-umask").mkdir()
    os.chmod(tmp_path / "shared-umask", 0o775)
    assert trusted_folder(tmp_path / "shared-umask" / "cache") == tmp_path / "shared-umask" / "cache"


def untrusted(kind: str, tmp_path: Path) -> Path:
    """A cache folder the check refuses: ``kind`` says why."""
    folder = tmp_path / kind
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "elsewhere")
    elif kind == "open-parent":  # a parent anyone may write into and rename in (not sticky)
        (tmp_path / kind).mkdir()
        os.chmod(tmp_path / kind, 0o777)
        folder = tmp_path / kind / "cache"
    elif kind == "a-file":
        folder.write_text("")
    else:
        folder.mkdir(mode=0o700)
        if kind == "world-writable":
            os.chmod(folder, 0o777)
        elif kind == "group-writable":
            os.chown(folder, -1, STRANGER)
            os.chmod(folder, 0o770)
        elif kind in ("stranger", "stranger-parent"):
            os.chown(folder, STRANGER, -1)
            folder = folder / "cache" if kind == "stranger-parent" else folder
            if kind == "stranger-parent":
                folder.mkdir()  # as root: a folder of ours inside someone else's
    return folder


#: each kind of untrusted folder -> the reason its one-line error gives
REFUSED = {
    "stranger": f"belongs to uid {STRANGER}, not to you",
    "world-writable": r"is writable by others \(mode 0777\)",
    "group-writable": r"is writable by others \(mode 0770\)",
    "symlink": "is a symlink",
    "open-parent": r"open-parent is writable by others \(mode 0777, not sticky\)",
    "stranger-parent": f"stranger-parent belongs to uid {STRANGER}",
    "a-file": "not a folder",
}


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_a_folder_others_could_write_is_refused_in_one_line(kind, tmp_path) -> None:
    need_root(kind)
    folder = untrusted(kind, tmp_path)
    with pytest.raises(UntrustedFolderError, match=REFUSED[kind]) as caught:
        trusted_folder(folder)
    assert str(folder) in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("kind", ["stranger", "world-writable", "symlink", "open-parent"])
def test_the_order_kernel_does_not_compile_from_an_untrusted_folder(kind, tmp_path, monkeypatch) -> None:
    """The evaluator falls back to the blocked kernel (the same ranking) with one warning naming the
    folder and why; nothing is compiled, nothing is written there."""
    need_root(kind)
    folder = untrusted(kind, tmp_path)
    monkeypatch.delenv("VSE_NO_COMPILE", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder))
    compiled: list[object] = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn) or fn)
    gen = torch.Generator().manual_seed(0)
    images, captions = torch.rand(20, 64, generator=gen), torch.rand(90, 64, generator=gen)
    kernel = OrderKernel(compile_min_work=1)
    with pytest.warns(RuntimeWarning, match=f"not compiling: {folder}.*{REFUSED[kind]}"):
        out = order_violation(images, captions, fused=True, squared=kernel.squared_violation)
    assert kernel.backend == "blocked" and compiled == []
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder)  # not pointed into it
    torch.testing.assert_close(out, order_violation(images, captions, fused=False), rtol=1e-5, atol=1e-5)
    assert not list(Path(os.path.realpath(folder)).glob(f"{PREFIX}*"))


def test_the_default_folders_are_the_users_own_and_private(tmp_path) -> None:
    xdg = tmp_path / "xdg"
    folder = Path(use_kernel_set_cache(environ := {"XDG_CACHE_HOME": str(xdg)}))
    assert environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder)
    assert folder.parent == xdg / "vse-toolkit" / "inductor" and folder.name.startswith(PREFIX)
    for path in (xdg, xdg / "vse-toolkit", folder.parent, folder):
        assert mode(path) == 0o700 and os.lstat(path).st_uid == os.geteuid()


# -- a cache that verifies its own content ----------------------------------------------------------------
def fill(folder: Path) -> None:
    (folder / "ab").mkdir(parents=True)
    (folder / "ab" / "kernel.py").write_text("x = 1\n")
    (folder / "ab" / "kernel.so").write_bytes(b"\x7fELF")


def test_a_cache_changed_since_its_manifest_is_emptied_with_one_warning(tmp_path, capsys) -> None:
    folder = tmp_path / "cache"
    with verified_cache(folder, "test kernels") as held:  # empty, no manifest: nothing to say
        fill(held)
    assert capsys.readouterr().err == "" and manifest_path(folder).is_file()
    with verified_cache(folder, "test kernels"):  # unchanged: believed, kept
        pass
    assert capsys.readouterr().err == "" and (folder / "ab" / "kernel.py").is_file()
    tamperings = [
        ("1 changed", lambda: (folder / "ab" / "kernel.py").write_text("x = 1\nimport os\n")),
        ("1 added", lambda: (folder / "ab" / "extra.py").write_text("")),
        ("1 removed", lambda: (folder / "ab" / "kernel.so").unlink()),
        ("1 added", lambda: (folder / "ab" / "link.py").symlink_to(tmp_path / "elsewhere.py")),
    ]
    for what, tamper in tamperings:
        tamper()
        with verified_cache(folder, "test kernels") as held:
            assert list(held.iterdir()) == []  # emptied before the compiler runs
            fill(held)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{folder}: not using this cache of test kernels: {what}" in err
    # content and no manifest (a folder from before manifests, or made by another program)
    manifest_path(folder).unlink()
    with verified_cache(folder, "test kernels") as held:
        assert list(held.iterdir()) == []
    assert "2 files but no manifest" in capsys.readouterr().err
    # the manifest records what the block left, also when it failed
    with pytest.raises(RuntimeError), verified_cache(folder) as held:
        fill(held)
        raise RuntimeError("compiler crashed")
    assert content_problem(folder) is None and (folder / "ab" / "kernel.py").is_file()
    clear_folder(folder)
    assert list(folder.iterdir()) == [] and not manifest_path(folder).exists()


def test_the_cache_and_the_folder_above_it_must_be_trusted(tmp_path) -> None:
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)  # its manifest and lock would lie where anyone can replace them
    with pytest.raises(UntrustedFolderError, match="open: is writable by others"):
        with verified_cache(tmp_path / "open" / "cache"):
            pass
    assert not (tmp_path / "open" / "cache").exists()


def test_processes_compiling_into_one_cache_take_turns(tmp_path) -> None:
    """Verify, compile and record hold the folder's lock: a second holder waits for the first (pytest-xdist
    workers compile into one folder) and then finds its manifest good, never a half-written cache."""
    folder = tmp_path / "cache"
    inside, release, events = threading.Event(), threading.Event(), []

    def first() -> None:
        with verified_cache(folder) as held:
            inside.set()
            release.wait(10)
            fill(held)
            events.append("first done")

    thread = threading.Thread(target=first)
    thread.start()
    inside.wait(10)
    threading.Timer(0.3, release.set).start()
    with verified_cache(folder) as held:
        events.append("second in")
        assert (held / "ab" / "kernel.py").is_file()  # the first one's content, believed
    thread.join()
    assert events == ["first done", "second in"]


PLANT = """
import json, sys, torch
from train.engine.similarity import order_violation
from train.retrieval.evaluate.order_kernel import OrderKernel
gen = torch.Generator().manual_seed(0)
images, captions = torch.rand(64, 32, generator=gen), torch.rand(80, 32, generator=gen)
kernel = OrderKernel(compile_min_work=1)
out = order_violation(images, captions, fused=True, squared=kernel.squared_violation)
ref = order_violation(images, captions, fused=False)
print(json.dumps({"backend": kernel.backend, "close": bool(torch.allclose(out, ref, rtol=1e-5, atol=1e-5))}))
"""


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("VSE_TEST_COMPILE", "1") == "0", reason="VSE_TEST_COMPILE=0")
def test_a_line_planted_in_a_cached_kernel_never_runs(tmp_path) -> None:
    """Issue 41's reproduction: a line appended to every ``.py`` of the compiled-kernel cache ran in the
    next process that used the kernel. Now that process finds the cache changed since its manifest, says
    so in one line, empties it and compiles afresh; the process after it uses the new cache quietly."""
    cache, marker = tmp_path / "ind", tmp_path / "PWNED"
    first = json.loads(child(PLANT, TORCHINDUCTOR_CACHE_DIR=str(cache)))
    if first["backend"] != "compiled":
        pytest.skip("torch.compile cannot build here")
    modules = list(cache.glob(f"{PREFIX}*/**/*.py"))
    assert modules
    for module in modules:
        with module.open("a") as fh:
            fh.write(f"open({str(marker)!r}, 'a').write(__file__ + '\\n')\n")
    planted = run_child(PLANT, TORCHINDUCTOR_CACHE_DIR=str(cache))
    assert not marker.exists(), marker.read_text()
    assert json.loads(planted.stdout.strip().splitlines()[-1]) == {"backend": "compiled", "close": True}
    warned = [line for line in planted.stderr.splitlines() if "not using this cache" in line]
    assert len(warned) == 1 and "1 changed since the toolkit compiled there" in warned[0], planted.stderr
    again = run_child(PLANT, TORCHINDUCTOR_CACHE_DIR=str(cache))
    assert json.loads(again.stdout.strip().splitlines()[-1]) == {"backend": "compiled", "close": True}
    assert "not using this cache" not in again.stderr and not marker.exists()
