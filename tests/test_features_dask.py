"""Dask executors: one task per block, output identical to in-process, a killed worker loses nothing.

One small ``LocalCluster`` (2 worker processes, 1 thread each) serves the tests through its
``tcp://`` address, the same path as a cluster started with ``dask scheduler`` / ``dask worker``.
"""

from __future__ import annotations

import os
from pathlib import Path

import cloudpickle
import helpers
import numpy as np
import pytest
import torch
from helpers import ColourFactory, ColourMapper, make_image_dataset, new_store, paths_of

from features.cli import main
from features.executors import open_executor
from features.executors.extract import extract
from features.executors.in_process import InProcessExecutor
from features.store.core import FeatureStore

distributed = pytest.importorskip("distributed")
# Workers cannot import the test modules: ship the test mappers by value.
cloudpickle.register_pickle_by_value(helpers)


class KillOnceMapper(ColourMapper):
    """Kills its own worker process (as an OOM kill would) the first time any worker calls it."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def __call__(self, images):
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return super().__call__(images)
        os.close(fd)
        os._exit(1)


class KillOnceFactory(ColourFactory):
    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker, self.key = marker, f"kill-once:{marker}"

    def build(self) -> KillOnceMapper:
        return KillOnceMapper(self.marker)


cloudpickle.register_pickle_by_value(__import__(__name__))


@pytest.fixture(scope="module")
def data(coco_sample, tmp_path_factory) -> Path:
    return make_image_dataset(tmp_path_factory.mktemp("prep"), coco_sample, 14)


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> np.ndarray:
    store = new_store(tmp_path_factory.mktemp("ref") / "s.zarr", 14, block=3)
    extract(store, paths_of(data), ColourFactory(), InProcessExecutor(), progress=False)
    return store.array("global")[:]


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        yield cluster


def test_local_cluster_equals_in_process(data, reference, tmp_path):
    store = new_store(tmp_path / "s.zarr", 14, block=3)
    with open_executor("local", workers=2) as executor:
        summary = extract(store, paths_of(data), ColourFactory(), executor, progress=False)
    assert summary.rows_written == 14
    np.testing.assert_array_equal(store.array("global")[:], reference)


def test_model_built_once_per_worker(cluster, data, reference, tmp_path):
    log = tmp_path / "builds.txt"
    store = new_store(tmp_path / "s.zarr", 14, block=2)
    with open_executor(cluster.scheduler_address) as executor:
        summary = extract(store, paths_of(data), ColourFactory(log=str(log)), executor, progress=False)
    assert summary.rows_written == 14 and store.blocks_done().all()
    pids = log.read_text().split()
    assert len(pids) == len(set(pids)) <= 2  # 7 tasks, at most one build per worker process
    np.testing.assert_array_equal(store.array("global")[:], reference)


def test_killed_worker_loses_and_duplicates_nothing(cluster, data, reference, tmp_path):
    marker = tmp_path / "killed-once"
    store = new_store(tmp_path / "s.zarr", 14, block=3)
    with open_executor(cluster.scheduler_address) as executor:
        summary = extract(store, paths_of(data), KillOnceFactory(str(marker)), executor, progress=False)
    assert marker.exists(), "no worker was killed"
    assert summary.rows_written == 14 and summary.failures == []
    np.testing.assert_array_equal(store.array("global")[:], reference)
    assert store.array("valid")[:].all() and store.blocks_done().all()


def test_real_mapper_on_cluster_equals_in_process(cluster, data, tmp_path):
    """Real EfficientNet-Lite0 ImageNet weights: the same --threads gives bit-identical rows.

    This process runs 3 torch threads, the workers 1 (Dask sets OMP_NUM_THREADS=1); the mapper
    pins its forward passes to --threads in both. Without that, CPU kernels sum in another order
    and rows differ in the last bits (up to 6.4e-6 here).
    """
    base = ["cnn", "--data", str(data), "--cnn", "efficientnet_lite0", "--weights", "imagenet",
            "--crops", "1", "--input-size", "128", "--block-size", "4", "--device", "cpu", "--threads", "1",
            "--no-progress"]
    old = torch.get_num_threads()
    torch.set_num_threads(3)  # not the run's count: the mapper sets --threads for its calls
    try:
        assert main([*base, "--out", str(tmp_path / "in.zarr")]) == 0
        assert torch.get_num_threads() == 3  # and restores the caller's afterwards
    finally:
        torch.set_num_threads(old)
    assert main([*base, "--out", str(tmp_path / "dask.zarr"), "--scheduler", cluster.scheduler_address]) == 0
    a, b = FeatureStore(tmp_path / "in.zarr"), FeatureStore(tmp_path / "dask.zarr")
    assert a.attrs["provenance"]["weights_sha256"].startswith("57934424")
    for name in ("global", "valid", "imgid"):
        np.testing.assert_array_equal(a.array(name)[:], b.array(name)[:])
    assert a.attrs["config"] == b.attrs["config"]
    assert a.attrs["provenance"]["torch_threads"] == b.attrs["provenance"]["torch_threads"] == 1


def test_mapper_runs_its_forward_passes_with_its_thread_count(coco_sample):
    """What a Dask worker (whose environment says 1 thread) does with ``threads=2``: the network
    runs with 2 intra-op threads during the call, and the process's count is restored after it."""
    from features.extractors.crop_mapper import ImageMapper
    from features.extractors.images import load_image

    mapper = ImageMapper.from_config({"cnn": "efficientnet_lite0", "weights": "none", "kind": "global",
                                      "crops": 1, "input_size": 32, "device": "cpu", "threads": 2})
    seen = []
    mapper.model.register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mapper([load_image(sorted((coco_sample / "images").iterdir())[0])])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(old)
    assert seen == [2] and mapper.config["threads"] == 2


def test_grid_regions_on_cluster_equal_in_process(cluster, data, tmp_path):
    """``features regions`` (real EfficientNet-Lite0 weights, 3 x 3 grid) on Dask workers: the region
    arrays are bit-identical to the in-process run with the same --threads."""
    base = ["regions", "--data", str(data), "--weights", "imagenet", "--input-size", "96",
            "--block-size", "4", "--device", "cpu", "--threads", "1", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "in.zarr")]) == 0
    assert main([*base, "--out", str(tmp_path / "dask.zarr"), "--scheduler", cluster.scheduler_address]) == 0
    a, b = FeatureStore(tmp_path / "in.zarr"), FeatureStore(tmp_path / "dask.zarr")
    assert a.array("regions").shape == (14, 9, 1280)
    for name in ("regions", "boxes", "counts", "image_size", "valid"):
        np.testing.assert_array_equal(a.array(name)[:], b.array(name)[:])
    assert a.attrs["config"] == b.attrs["config"]
