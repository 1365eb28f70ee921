"""The query API and ``train query``: a tiny real pipeline (synthetic images, random EfficientNet-Lite0)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import QUERY_PIPELINE

from train.cli import main as train_main  # every train command, train pipeline too
from train.retrieval.loaded import embed_split
from train.retrieval.open import load_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def assert_ranked_like(ids: list[int], hit_scores: list[float], reference: np.ndarray, rtol: float,
                       atol: float) -> None:
    """``ids`` (best first, with their ``hit_scores``) are a top-``len(ids)`` of the ``reference`` scores
    (indexed by id) computed another way, up to the rounding between the two ways: each hit's score is
    its reference score within ``rtol``/``atol``, the hits come in reference order and beat every other
    candidate up to twice that. Where no two reference scores are that close, this is exactly
    ``ids == argsort(-reference)[:len(ids)]``; near-ties may fall either way, as on another CPU's kernels."""
    ref = reference[ids]
    np.testing.assert_allclose(hit_scores, ref, rtol=rtol, atol=atol)
    tol = 2 * (rtol * float(np.abs(reference).max()) + atol)
    assert len(set(ids)) == len(ids)
    assert all(ref[k] >= ref[k + 1] - tol for k in range(len(ids) - 1)), (ids, ref)
    others = np.delete(reference, ids)
    assert not len(others) or others.max() <= ref.min() + tol, (ids, ref, np.sort(others)[-3:])


@pytest.fixture(scope="module", params=["cnn", "fne"])
def run_dir(request, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp(f"query-{request.param}")
    (root / "p.yaml").write_text(QUERY_PIPELINE.format(kind=request.param))
    assert train_main(["pipeline", "tiny", "--pipelines", str(root / "p.yaml"), "--until", "train"]) == 0
    return root / "run"


def test_image_queries_are_featurized_like_the_store(run_dir: Path) -> None:
    """A query image goes through the store's own network, crops, statistics and thresholds.

    What holds on every CPU (docs/reproducibility.md): the raw activations equal the store's row up
    to float32 rounding, since the query runs in another batch shape and CPU kernels are chosen per
    shape (seen: AVX-512/AMX Xeons, not AVX2 EPYCs). A ternary FNE code may therefore differ from the
    stored one only where a threshold lies between the two raw values; the embedding then differs
    by exactly those codes and by nothing else.
    """
    from features.extractors.images import load_image
    from features.featurize import Featurizer
    from features.store.ternary import standardize
    from train.engine.inference import embed_images

    run = load_run(run_dir, device="cpu")
    emb = embed_split(run, "test")
    ids = emb.imgids[:3]
    paths = [str(run.dataset.images[i].path) for i in ids]
    featurizer = Featurizer.from_store(run.settings.features)
    fne = featurizer.key == "fne"
    stored_raw = np.asarray(featurizer.store.array("fne/raw" if fne else "global")[:])[ids]
    (raw,) = featurizer.mapper([load_image(p) for p in paths]).values()
    # float32 rounding of sums reordered by another kernel: far below 1e-4 of the row's scale
    scale = float(np.abs(stored_raw).max())
    np.testing.assert_allclose(raw, stored_raw, rtol=1e-4, atol=1e-4 * scale)
    rows, failures = featurizer(paths)
    assert failures == []
    if fne:
        stored = np.asarray(featurizer.store.array("fne/ternary")[:])[ids]
        z_query = standardize(raw, featurizer.mean, featurizer.std)
        z_store = standardize(stored_raw, featurizer.mean, featurizer.std)
        for r, c in np.argwhere(rows != stored):
            low, high = sorted((float(z_query[r, c]), float(z_store[r, c])))
            assert any(low <= t <= high for t in featurizer.thresholds), (r, c, low, high)
        stored_rows = torch.from_numpy(stored.astype(np.float32))
    else:
        stored_rows = torch.from_numpy(stored_raw)
    expected = torch.from_numpy(rows)
    again = run.encode_images(paths)
    # the query's embedding is the run's embedding of the query's rows (same call, same shapes) ...
    torch.testing.assert_close(again, embed_images(run.model, expected, run.device), rtol=0, atol=0)
    # ... and the split's embeddings are those of the stored rows (another batch shape: rounding only)
    torch.testing.assert_close(emb.images[:3], embed_images(run.model, stored_rows, run.device),
                               rtol=0, atol=1e-5)
    if not fne or bool((rows == stored).all()):
        torch.testing.assert_close(again, emb.images[:3], rtol=0, atol=1e-5)


def test_search_ranks_the_split_by_the_runs_similarity(run_dir: Path) -> None:
    run = load_run(run_dir, device="cpu")
    emb = embed_split(run, "test")
    text = emb.texts[0]
    [hits] = run.search(text=text, top=4)
    assert [h.rank for h in hits] == [1, 2, 3, 4]
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    assert {h.imgid for h in hits} <= set(emb.imgids.tolist())
    # the scores are the run's similarity between the text and those images
    from train.engine.similarity import similarity

    q = run.encode_text([text])
    # the same embeddings (embed_split, same shapes), the same kernel and a stable sort as the search: the
    # same floats, so even exactly tied scores fall in the same order, on every CPU
    full = similarity(emb.images, q, run.settings.measure)[:, 0]
    best = torch.sort(full, descending=True, stable=True)
    assert [int(emb.imgids[i]) for i in best.indices[:4]] == [h.imgid for h in hits]
    np.testing.assert_allclose(scores, best.values[:4].numpy(), rtol=1e-6)
    [caps] = run.search(image=str(run.dataset.images[int(emb.imgids[1])].path), top=3, split=None)
    assert len(caps) == 3 and all(c.text for c in caps)


def test_train_query_command(run_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "hits.json"
    assert train_main(["query", "--run", str(run_dir), "--text", "a red circle", "--text", "a blue square",
                       "--top", "2", "--device", "cpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("query: ") == 2
    data = json.loads(out.read_text())
    assert [len(q["hits"]) for q in data] == [2, 2] and data[0]["query"] == "a red circle"
    assert train_main(["query", "--run", str(run_dir), "--device", "cpu"]) == 2
    assert "--text" in capsys.readouterr().err


def test_commands_that_read_a_run_take_pipeline(run_dir: Path, tmp_path: Path, capsys) -> None:
    pipelines = str(run_dir.parent / "p.yaml")
    assert train_main(["evaluate", "--pipeline", "tiny", "--pipelines", pipelines, "--device", "cpu"]) == 0
    assert (run_dir / "eval" / "test_best.json").is_file()
    assert train_main(["query", "--pipeline", "tiny", "--pipelines", pipelines, "--text", "a red circle",
                       "--device", "cpu"]) == 0
    assert train_main(["export-embeddings", "--pipeline", "tiny", "--pipelines", pipelines,
                       "--out", str(tmp_path / "e"), "--device", "cpu"]) == 0
    assert (tmp_path / "e" / "test_img.npy").is_file()
    capsys.readouterr()
    assert train_main(["query", "--pipeline", "tiny", "--pipelines", pipelines, "--run", str(run_dir),
                       "--text", "x"]) == 2
    assert "not both" in capsys.readouterr().err


def _collection(root: Path, kind: str, input_size: int = 96) -> tuple[Path, Path]:
    """Another prepared dataset (other images) and its store, extracted with the given settings."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "c.yaml").write_text(QUERY_PIPELINE.format(kind=kind).replace("seed: 2", "seed: 5").replace(
        "num_images: 48", "num_images: 24").replace("input_size: 96", f"input_size: {input_size}").replace(
        "out: data", "out: other").replace("out: feats.zarr", "out: other.zarr"))
    assert train_main(["pipeline", "tiny", "--pipelines", str(root / "c.yaml"), "--until", "features"]) == 0
    return root / "other", root / "other.zarr"


def test_search_another_collection_with_its_store(run_dir: Path, tmp_path: Path, capsys) -> None:
    from features.store.core import FeatureStore
    from features.store.read import parse_spec

    run = load_run(run_dir, device="cpu")
    kind = FeatureStore(parse_spec(run.settings.features)[0]).attrs["config"]["kind"]
    data, store = _collection(tmp_path, kind)
    if kind == "fne":
        with pytest.raises(Exception, match="Full-Network Embedding store is not supported"):
            run.search(text="a red circle", data=data, features=str(store))
        return
    from prep.dataset import PreparedDataset
    from train.engine.similarity import similarity

    other = PreparedDataset.load(data)
    [hits] = run.search(text="a red circle", top=5, split=None, data=data, features=str(store))
    # the store's rows embed as the run's own featurizer embeds those image files
    paths = [str(im.path) for im in other.images]
    query = run.encode_text(["a red circle"])
    scores = similarity(run.encode_images(paths), query, run.settings.measure)[:, 0]
    best = torch.sort(scores, descending=True, stable=True)
    # the store's rows and the re-featurised files differ by float rounding (another batch shape), so two
    # candidates within that rounding of each other may come in either order: ranked alike up to such ties
    assert_ranked_like([h.imgid for h in hits], [h.score for h in hits], scores.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([h.score for h in hits], best.values[:5].numpy(), rtol=1e-5, atol=1e-6)
    assert all(h.path == paths[h.imgid] for h in hits)
    [caps] = run.search(image=paths[0], top=3, data=data, features=str(store), split=None)
    assert {c.imgid for c in caps} <= set(range(len(other.images)))

    assert train_main(["query", "--run", str(run_dir), "--text", "a red circle", "--data", str(data),
                       "--features", str(store), "--device", "cpu", "--top", "2"]) == 0
    assert str(data) in capsys.readouterr().out
    wrong_data, wrong_store = _collection(tmp_path / "w", "cnn", input_size=64)
    capsys.readouterr()
    assert train_main(["query", "--run", str(run_dir), "--text", "x", "--data", str(wrong_data),
                       "--features", str(wrong_store), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "input_size = 64" in err and len(err.splitlines()) == 1
    assert train_main(["query", "--run", str(run_dir), "--text", "x", "--data", str(data),
                       "--device", "cpu"]) == 2
    assert "both --data and --features" in capsys.readouterr().err


def test_a_shared_model_folder_queries_like_its_run(run_dir: Path, tmp_path: Path) -> None:
    """``train export-model``: the folder embeds texts and images and ranks exactly as the run does, and
    featurizes images from what model.json records, without the training store."""
    model = tmp_path / "model"
    assert train_main(["export-model", "--run", str(run_dir), "--out", str(model)]) == 0
    run, shared = load_run(run_dir, device="cpu"), load_run(model, device="cpu")
    emb = embed_split(run, "test")
    paths = [str(run.dataset.images[i].path) for i in emb.imgids[:3]]
    texts = ["a red circle", "blue"]
    assert shared.search(text=texts, top=5) == run.search(text=texts, top=5)
    assert shared.search(image=paths[0], top=3) == run.search(image=paths[0], top=3)

    meta = json.loads((model / "model.json").read_text())
    meta["settings"]["data"] = str(tmp_path / "gone")
    meta["settings"]["features"] = str(tmp_path / "gone.zarr")
    (model / "model.json").write_text(json.dumps(meta))
    moved = load_run(model, device="cpu")
    torch.testing.assert_close(moved.encode_images(paths), emb.images[:3], rtol=0, atol=1e-6)
    torch.testing.assert_close(moved.encode_text(emb.texts[:2]), emb.captions[:2], rtol=0, atol=1e-6)
    with pytest.raises(Exception, match="not on this machine"):
        moved.search(text="a red circle")


# -- the query cache (issue 43.5) -------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def query_cache(tmp_path: Path, monkeypatch) -> Path:
    """A fresh query cache folder for each test of this file (none writes into the user's cache home)."""
    folder = tmp_path / "query-cache"
    monkeypatch.setenv("VSE_QUERY_CACHE", str(folder))
    return folder


class Calls:
    """How often a fresh run's encoders and the feature reader run."""

    def __init__(self, run, monkeypatch) -> None:
        from train.retrieval import loaded

        self.images = self.captions = self.features = 0
        encode_images, encode_captions = run.model.encode_images, run.model.encode_captions

        def images(*args, **kwargs):
            self.images += 1
            return encode_images(*args, **kwargs)

        def captions(*args, **kwargs):
            self.captions += 1
            return encode_captions(*args, **kwargs)

        def features(*args, **kwargs):
            self.features += 1
            return real_read(*args, **kwargs)

        real_read = loaded.read_features
        run.model.encode_images, run.model.encode_captions = images, captions
        monkeypatch.setattr(loaded, "read_features", features)


def _fresh(run_dir: Path, monkeypatch) -> tuple[object, Calls]:
    run = load_run(run_dir, device="cpu")
    return run, Calls(run, monkeypatch)


def test_a_second_query_reads_its_candidates_from_the_cache(run_dir: Path, query_cache: Path,
                                                            monkeypatch) -> None:
    """The first query embeds one side of the split; a second one, in another run object (another
    process), embeds only the query: no image encoder over the split, no read of the feature store."""
    from train.retrieval.query_cache import QUERY_CACHE_ENV

    image = str(load_run(run_dir, device="cpu").dataset.images[0].path)
    first, calls = _fresh(run_dir, monkeypatch)
    text_hits = first.search(text=["a red circle", "blue"], top=4)
    assert calls.features == 1 and calls.images >= 1 and calls.captions == 1  # the images, then the query
    image_hits = first.search(image=image, top=3)
    assert calls.captions >= 2  # the split's captions, once
    assert [len(list(query_cache.glob(f"{side}-*.npz"))) for side in ("images", "captions")] == [1, 1]

    second, calls = _fresh(run_dir, monkeypatch)
    assert second.search(text=["a red circle", "blue"], top=4) == text_hits
    assert (calls.features, calls.images, calls.captions) == (0, 0, 1)  # the query text only
    assert second.search(image=image, top=3) == image_hits
    assert (calls.features, calls.images, calls.captions) == (0, 1, 1)  # the query image only

    # bit-identical rankings: every score equals the one of a run that embeds the split afresh
    monkeypatch.setenv(QUERY_CACHE_ENV, "0")
    fresh = load_run(run_dir, device="cpu")
    top = len(fresh.dataset.images_of("test"))
    texts = ["a red circle", "blue"]
    assert fresh.search(text=texts, top=top) == second.search(text=texts, top=top)
    emb = embed_split(fresh, "test")
    cached = second.__dict__["_candidates"]["test", "images"]
    assert torch.equal(cached.embeddings, emb.images) and (cached.imgids == emb.imgids).all()
    cached = second.__dict__["_candidates"]["test", "captions"]
    assert torch.equal(cached.embeddings, emb.captions) and cached.texts == emb.texts


def test_hits_show_the_images_captions_and_the_captions_image(run_dir: Path, query_cache: Path,
                                                              tmp_path: Path, capsys) -> None:
    """A text query's hits carry their file and first two captions, an image query's their caption and its
    image's file; ``train query`` prints them and ``--json`` holds them, in both directions."""
    run = load_run(run_dir, device="cpu")
    [hits] = run.search(text="a red circle", top=3)
    for h in hits:
        own = [s.raw for s in run.dataset.sentences_of("test", "en") if s.imgid == h.imgid]
        assert h.path == str(run.dataset.images[h.imgid].path) and list(h.captions) == own[:2]
    image = str(run.dataset.images[int(embed_split(run, "test").imgids[0])].path)
    [caps] = run.search(image=image, top=3)
    for c in caps:
        assert c.text in [s.raw for s in run.dataset.sentences if s.imgid == c.imgid]
        assert c.path == str(run.dataset.images[c.imgid].path) and c.captions == ()

    for option, query, top in (("--text", "a red circle", 3), ("--image", image, 2)):
        out = tmp_path / f"{option[2:]}.json"
        assert train_main(["query", "--run", str(run_dir), option, query, "--top", str(top),
                           "--device", "cpu", "--json", str(out)]) == 0
        printed = capsys.readouterr().out
        [record] = json.loads(out.read_text())
        assert record["query"] == query and len(record["hits"]) == top
        for hit in record["hits"]:
            assert hit["path"] in printed and Path(hit["path"]).is_file()
            if option == "--text":
                assert len(hit["captions"]) == 2 and all(c in printed for c in hit["captions"])
            else:
                assert hit["text"] in printed and hit["captions"] == []


def _perturb_checkpoint(run: Path) -> None:
    """Other weights in the run's best checkpoint (one tensor scaled), under the same name."""
    from train.run.checkpoint import load_checkpoint, save_checkpoint

    best = run / "checkpoints" / "best.pt"
    state = load_checkpoint(best)
    name = next(k for k, v in state["model"].items() if v.is_floating_point() and v.dim() == 2)
    state["model"][name] = state["model"][name] * 1.5
    save_checkpoint(best, state)


def test_the_cache_is_rebuilt_for_other_weights_another_store_generation_or_damage(
        run_dir: Path, query_cache: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """Each is a rebuild equal to a query without the cache; other weights and another generation of the
    store are expected (no warning), damage is one warning line naming the file."""
    import shutil

    from features.store.core import FeatureStore
    from features.store.read import parse_spec
    from train.retrieval.query_cache import QUERY_CACHE_ENV

    def query(where: Path) -> tuple[list, Calls]:
        run, calls = _fresh(where, monkeypatch)
        return run.search(text=["a red circle", "blue"], top=4), calls

    def afresh(where: Path) -> list:
        monkeypatch.setenv(QUERY_CACHE_ENV, "0")
        try:
            return load_run(where, device="cpu").search(text=["a red circle", "blue"], top=4)
        finally:
            monkeypatch.setenv(QUERY_CACHE_ENV, str(query_cache))

    copy = tmp_path / "run-copy"
    shutil.copytree(run_dir, copy)
    before, _ = query(copy)
    [file] = query_cache.glob("images-*.npz")
    _perturb_checkpoint(copy)  # other weights under the same name: embedded again, the file replaced
    hits, calls = query(copy)
    assert calls.images >= 1 and calls.features == 1 and hits == afresh(copy) and hits != before
    assert list(query_cache.glob("images-*.npz")) == [file]
    hits, calls = query(copy)
    assert calls.images == 0 and hits == afresh(copy)
    assert "warning" not in capsys.readouterr().err

    # a store written since (its generation token renewed): embedded again
    store = FeatureStore(parse_spec(load_run(copy, device="cpu").settings.features)[0], mode="r+")
    store.set_attrs(complete=True)
    hits, calls = query(copy)
    assert calls.images >= 1 and calls.features == 1 and hits == afresh(copy)

    # damage: one warning line naming the file, then a rebuild; the rebuilt file is used without a word
    for damage, words in ((_edit_embeddings, "does not match its digest"), (_truncate, "")):
        damage(file)
        capsys.readouterr()
        hits, calls = query(copy)
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(file) in err and words in err, err
        assert calls.images >= 1 and hits == afresh(copy)
        hits, calls = query(copy)
        assert calls.images == 0 and capsys.readouterr().err == ""


def _edit_embeddings(file: Path) -> None:
    """One value of the cached embeddings changed, the archive otherwise well formed (its CRCs right): what
    a tool that does not know the format leaves."""
    import zipfile

    with zipfile.ZipFile(file) as zf:
        members = {info.filename: zf.read(info) for info in zf.infolist()}
    data = bytearray(members["embeddings.npy"])
    data[-3] ^= 0x40
    members["embeddings.npy"] = bytes(data)
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED) as zf:
        for name, content in members.items():
            zf.writestr(name, content)


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
