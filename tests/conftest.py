"""Shared fixtures. Tests that need ``../shared/data`` skip with a clear reason when it is absent."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("VSE_SHARED_DATA", ROOT.parent / "shared" / "data"))

#: pytest-xdist runs the suite in worker processes (``-n``): each gets its share of the cores
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // WORKERS)))

# A suite started in the background without job control (`make test &`, some CI runners) inherits SIGINT
# ignored, and so would every command it starts: the Ctrl-C tests need the disposition of a terminal,
# so give this process Python's own handler (the commands it starts then install theirs as usual).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def query_cache_in_tmp(tmp_path_factory) -> Iterator[None]:
    """Queries made by any test (and the commands it starts) cache their embeddings in a temporary folder,
    never in the user's ``~/.cache/vse-toolkit/query``."""
    before = os.environ.get("VSE_QUERY_CACHE")
    os.environ["VSE_QUERY_CACHE"] = str(tmp_path_factory.mktemp("query-cache"))
    yield
    if before is None:
        os.environ.pop("VSE_QUERY_CACHE", None)
    else:
        os.environ["VSE_QUERY_CACHE"] = before


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run a test with one torch thread, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _need(sub: str) -> Path:
    path = SHARED_DATA / sub
    if not path.exists():
        pytest.skip(f"real test data not found: {path} (set VSE_SHARED_DATA to the shared data folder)")
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared real-data folder (``../shared/data``); skips when it is missing."""
    return _need("")


@pytest.fixture(scope="session")
def coco_sample() -> Path:
    """801 real COCO 2014 JPEGs with captions (``coco_sample/``)."""
    return _need("coco_sample")


@pytest.fixture(scope="session")
def flickr8k_dir() -> Path:
    """The real Flickr8k token file and split lists."""
    return _need("flickr8k")


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """Multi30k task1/task2 raw files."""
    return _need("multi30k")


@pytest.fixture(scope="session")
def coco_annotation_samples() -> Path:
    """First 100 images/annotations of the official COCO caption files."""
    return _need("coco_annotation_samples")


# -- inputs several test files build (helpers.py builds them; a module-scoped fixture per file that asks) ----
@pytest.fixture(scope="module")
def textcls_prepared(tmp_path_factory) -> Path:
    """A tiny prepared classification dataset (:func:`helpers.prepare_tiny_textcls`)."""
    from helpers import prepare_tiny_textcls

    return prepare_tiny_textcls(tmp_path_factory.mktemp("textcls"))


@pytest.fixture(scope="module")
def compare_inputs(tmp_path_factory) -> dict[str, str]:
    """The inputs of a tiny ``train compare`` (:func:`helpers.make_compare_inputs`)."""
    from helpers import make_compare_inputs

    return make_compare_inputs(tmp_path_factory.mktemp("compare"))


@pytest.fixture(scope="module")
def tiny_chain_run(tmp_path_factory) -> Path:
    """One epoch of the tiny CHAIN-VSE on :func:`helpers.safety_inputs` (a finished run directory)."""
    from helpers import safety_inputs, train_tiny_chain

    data = safety_inputs(tmp_path_factory.mktemp("tiny-run"))
    return train_tiny_chain(data, tmp_path_factory.mktemp("trained") / "run")
