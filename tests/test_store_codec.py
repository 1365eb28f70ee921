"""Region rows compressed by another codec (issue 33.1): ``--codec lz4`` stores (Blosc LZ4HC) read as the
same bits by the direct reader and by Zarr, checked as every store is, bounded against damaged chunks, and
``features recompress`` copies that round-trip bit for bit, resume, and refuse what they cannot copy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import make_image_dataset

import features.store.recompress as recompress
from features.cli import main
from features.store.codec_bounds import blosc_decode_into, check_blosc
from features.store.core import FeatureStore
from features.store.read import layout_digest
from features.store.rows import ShardRows, open_rows
from features.store.verify import verify_store
from vsecore.errors import UserError

#: 35,840-byte rows: over SHARD_ROW_BYTES, so one inner chunk per row in a shard per block
ROWS, BLOCK, SHAPE = 40, 16, (28, 640)


def make_store(path: Path, codec: str, dtype: str = "float16", seed: int = 3) -> FeatureStore:
    """A finished region store of random rectified rows, row 5 a recorded failure (NaN, invalid)."""
    store = FeatureStore.create(path, np.arange(ROWS), {"regions": SHAPE, "counts": ()}, BLOCK,
                                config={"kind": "regions"}, provenance={"network": "random"},
                                dtypes={"regions": dtype, "counts": "int32"}, codec=codec)
    rng = np.random.default_rng(seed)
    for block in range(store.n_blocks):
        start, stop = store.block_rows(block)
        x = np.maximum(rng.standard_normal((stop - start, *SHAPE)), 0).astype(dtype)
        valid = np.ones(stop - start, bool)
        failures = []
        if start <= 5 < stop:
            x[5 - start], valid[5 - start] = np.nan, False
            failures = [{"imgid": 5, "path": "x.jpg", "error": "unreadable"}]
        counts = np.full(stop - start, 28, np.int32)
        store.write_block(block, {"regions": x, "counts": counts}, valid, failures)
    store.set_attrs(complete=True, failures=[{"imgid": 5, "path": "x.jpg", "error": "unreadable"}])
    return FeatureStore(path)


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint8)


def inner_codec(path: Path) -> dict:
    meta = json.loads((path / "regions" / "zarr.json").read_text())
    return meta["codecs"][0]["configuration"]["codecs"][1]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_lz4_rows_are_the_zstd_rows(tmp_path: Path, dtype: str) -> None:
    zstd = make_store(tmp_path / "z.zarr", "zstd", dtype)
    lz4 = make_store(tmp_path / "l.zarr", "lz4", dtype)
    assert inner_codec(zstd.path)["name"] == "zstd"
    blosc = {"typesize": np.dtype(dtype).itemsize, "cname": "lz4hc", "clevel": 5, "shuffle": "shuffle",
             "blocksize": 0}
    assert inner_codec(lz4.path) == {"name": "blosc", "configuration": blosc}
    assert ShardRows.matches(lz4.array("regions"))
    a, valid = open_rows(f"{zstd.path}:regions")
    b, _ = open_rows(f"{lz4.path}:regions")
    assert a.direct and b.direct and not valid[5]
    rng = np.random.default_rng(0)
    for batch in [rng.choice(ROWS, 12, replace=True) for _ in range(4)] + [np.arange(ROWS)]:
        got = b.take(batch)
        assert np.array_equal(bits(got), bits(a.take(batch)))
        assert np.array_equal(bits(got), bits(np.asarray(lz4.array("regions")[:])[batch]))  # Zarr's reader
    assert layout_digest(f"{lz4.path}:regions") == layout_digest(f"{zstd.path}:regions")
    assert verify_store(lz4.path).ok


def test_the_record_names_the_codec(tmp_path: Path) -> None:
    store = make_store(tmp_path / "l.zarr", "lz4")
    meta = json.loads((store.path / "zarr.json").read_text())
    meta["attributes"]["codec"] = "zstd"  # the record no longer matches the arrays
    (store.path / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"regions/zarr.json: codecs is sharding_indexed\[bytes, blosc\], but "
                                        r"this store's record .* implies sharding_indexed\[bytes, zstd\]"):
        FeatureStore(store.path)
    meta["attributes"]["codec"] = "brotli"
    (store.path / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="attribute codec is 'brotli', not one of zstd, lz4"):
        FeatureStore(store.path)
    del meta["attributes"]["codec"]  # a store from before the attribute: zstd
    (store.path / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="codecs is"):
        FeatureStore(store.path)


def test_blosc_headers_are_checked_before_decompressing() -> None:
    import numcodecs.blosc

    x = np.maximum(np.random.default_rng(0).standard_normal(4096), 0).astype(np.float16)
    data = bytearray(numcodecs.blosc.Blosc("lz4hc", 5, 1, typesize=2).encode(x))
    out = np.empty_like(x)
    blosc_decode_into(bytes(data), out)
    assert np.array_equal(bits(out), bits(x))
    with pytest.raises(ValueError, match="declares 8192 bytes, but the chunk holds 4096"):
        blosc_decode_into(bytes(data), out[:2048])
    bomb = bytearray(data)
    bomb[4:8] = (1 << 30).to_bytes(4, "little")  # a header that declares a gigabyte
    with pytest.raises(ValueError, match="declares 1073741824 bytes"):
        check_blosc(bytes(bomb), None)
    with pytest.raises(ValueError, match="compressed bytes, but the chunk has"):
        blosc_decode_into(bytes(data[:-3]), out)  # truncated: c-blosc would read past the end
    with pytest.raises(ValueError, match="not a Blosc chunk"):
        blosc_decode_into(b"\x28\xb5\x2f\xfd" + bytes(20), out)


def test_a_damaged_blosc_row_is_one_line(tmp_path: Path) -> None:
    store = make_store(tmp_path / "l.zarr", "lz4")
    array = store.array("regions")
    file = store.path / array.zarr.path / array.chunk_key((1, 0, 0))
    data = bytearray(file.read_bytes())
    index = np.frombuffer(bytes(data[-(BLOCK * 16 + 4):-4]), "<u8").reshape(-1, 2)
    offset = int(index[2, 0])
    data[offset + 4:offset + 8] = (10**8).to_bytes(4, "little")  # row 18 declares 100 MB
    file.write_bytes(bytes(data))
    rows, _ = open_rows(f"{store.path}:regions")
    rows.take(np.arange(BLOCK))  # block 0 is intact
    with pytest.raises(UserError, match=r"'regions' is damaged at rows 16-31 \(chunk file regions/c/1/0/0.*"
                                        r"declares 100000000 bytes"):
        rows.take(np.array([18]))
    report = verify_store(store.path)
    assert not report.ok and [b for b in report.blocks] == [1]


def test_recompress_round_trips_bit_for_bit(tmp_path: Path, capsys) -> None:
    source = make_store(tmp_path / "z.zarr", "zstd")
    assert main(["recompress", str(source.path), "--codec", "lz4", "--out", str(tmp_path / "l.zarr")]) == 0
    assert "features: wrote" in capsys.readouterr().out
    back_out = str(tmp_path / "z2.zarr")
    assert main(["recompress", str(tmp_path / "l.zarr"), "--codec", "zstd", "--out", back_out]) == 0
    lz4, back = FeatureStore(tmp_path / "l.zarr"), FeatureStore(tmp_path / "z2.zarr")
    assert (lz4.attrs["codec"], back.attrs["codec"]) == ("lz4", "zstd")
    assert inner_codec(back.path) == inner_codec(source.path)
    origin = lz4.attrs["provenance"].pop("recompressed_from")
    assert origin["generation"] == source.attrs["generation"] and origin["codec"] == "zstd"
    assert lz4.attrs["provenance"] == source.attrs["provenance"]
    for key in ("config", "failures", "outputs", "dtypes", "block_size", "complete"):
        assert lz4.attrs[key] == source.attrs[key] == back.attrs[key], key
    for name in ("imgid", "valid", "failures", "blocks_done", "regions", "counts"):
        want = np.asarray(source.array(name)[:])
        for copy in (lz4, back):
            got = np.asarray(copy.array(name)[:])
            assert got.dtype == want.dtype and (np.array_equal(got, want) if want.dtype.kind in "OUT"
                                                else np.array_equal(bits(got), bits(want))), name
    digests = {layout_digest(f"{s.path}:regions") for s in (source, lz4, back)}
    assert len(digests) == 1 and verify_store(lz4.path).ok and verify_store(back.path).ok


def test_an_interrupted_recompress_resumes(tmp_path: Path, monkeypatch) -> None:
    source = make_store(tmp_path / "z.zarr", "zstd")
    out = tmp_path / "l.zarr"
    copy_block = recompress._copy_block

    def stop_at_block_1(src, dst, block):
        if block == 1:
            raise KeyboardInterrupt
        copy_block(src, dst, block)

    monkeypatch.setattr(recompress, "_copy_block", stop_at_block_1)
    with pytest.raises(KeyboardInterrupt):
        recompress.recompress_store(source.path, out, "lz4")
    with pytest.raises(UserError, match="the store is incomplete"):
        open_rows(f"{out}:regions")
    with pytest.raises(UserError, match="not an interrupted `features recompress` of .* to --codec zstd"):
        recompress.recompress_store(source.path, out, "zstd")
    monkeypatch.setattr(recompress, "_copy_block", copy_block)
    summary = recompress.recompress_store(source.path, out, "lz4")
    assert (summary.blocks_written, summary.blocks) == (2, 3)
    a, _ = open_rows(f"{source.path}:regions")
    b, _ = open_rows(f"{out}:regions")
    assert np.array_equal(bits(a.take(np.arange(ROWS))), bits(b.take(np.arange(ROWS))))
    FeatureStore(source.path, mode="r+").set_attrs(note="rewritten")  # a new generation: another source
    with pytest.raises(UserError, match="exists and is not an interrupted"):
        recompress.recompress_store(source.path, out, "lz4")
    assert recompress.recompress_store(source.path, out, "lz4", overwrite=True).blocks_written == 3


def test_recompress_refusals(tmp_path: Path, capsys) -> None:
    source = make_store(tmp_path / "z.zarr", "zstd")
    glob = FeatureStore.create(tmp_path / "g.zarr", np.arange(4), {"global": 8}, 4, {"kind": "cnn"}, {})
    glob.write_block(0, {"global": np.ones((4, 8), np.float32)}, np.ones(4, bool), [])
    glob.set_attrs(complete=True)
    cases = [
        (["recompress", str(glob.path), "--codec", "lz4", "--out", str(tmp_path / "x.zarr")],
         "no array of this store is stored one chunk per row"),
        (["recompress", str(source.path), "--codec", "lz4", "--out", str(source.path / "inside")],
         "--out"),
        (["recompress", str(source.path), "--codec", "lz4", "--out", str(glob.path)],
         "exists and is not an interrupted `features recompress`"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        assert message in capsys.readouterr().err
    FeatureStore(source.path, mode="r+").set_attrs(complete=False)
    assert main(["recompress", str(source.path), "--codec", "lz4", "--out", str(tmp_path / "y.zarr")]) == 2
    assert "the store is incomplete" in capsys.readouterr().err


@pytest.mark.usefixtures("one_torch_thread")
def test_features_regions_writes_lz4(coco_sample, tmp_path: Path, capsys) -> None:
    data = make_image_dataset(tmp_path / "prep", coco_sample, 4)
    out = tmp_path / "r.zarr"
    grid = ["--weights", "none", "--input-size", "96", "--device", "cpu", "--no-progress", "--threads", "1"]
    assert main(["regions", "--data", str(data), "--out", str(out), *grid, "--codec", "lz4"]) == 0
    # rows of 9 x 1280 float32: one chunk per row, compressed by Blosc
    assert FeatureStore(out).attrs["codec"] == "lz4" and inner_codec(out)["name"] == "blosc"
    assert verify_store(out, data).ok
    assert main(["regions", "--data", str(data), "--out", str(out), *grid]) == 2  # resumed with zstd
    assert "made with --codec lz4, this run asks for --codec zstd" in capsys.readouterr().err
    assert main(["recompress", str(out), "--codec", "zstd", "--out", str(tmp_path / "z.zarr")]) == 0
    a, _ = open_rows(f"{out}:regions", data)
    b, _ = open_rows(f"{tmp_path / 'z.zarr'}:regions", data)
    assert np.array_equal(bits(a.take(np.arange(4))), bits(b.take(np.arange(4))))


@pytest.mark.usefixtures("one_torch_thread")
def test_a_run_accepts_the_recompressed_copy_in_place_of_its_store(tmp_path: Path, capsys) -> None:
    from prep.cli import main as prep_main
    from prep.dataset import PreparedDataset
    from train.cli import main as train_main

    prepared = tmp_path / "prepared"
    assert prep_main(["synthetic", "--out", str(prepared), "--num-images", "48", "--image-size", "32",
                      "--captions-per-image", "2", "-q"]) == 0
    n = len(PreparedDataset.load(prepared).images)
    store = FeatureStore.create(tmp_path / "r.zarr", np.arange(n), {"regions": (8, 1024), "counts": ()}, 16,
                                config={"kind": "regions"}, provenance={}, dtypes={"counts": "int32"})
    rng = np.random.default_rng(0)
    for block in range(store.n_blocks):  # 32 KiB rows: one chunk per row
        start, stop = store.block_rows(block)
        rows = {"regions": rng.standard_normal((stop - start, 8, 1024)).astype(np.float32),
                "counts": np.full(stop - start, 8, np.int32)}
        store.write_block(block, rows, np.ones(stop - start, bool), [])
    store.set_attrs(complete=True)
    run = tmp_path / "run"
    assert train_main(["clmr", "--data", str(prepared), "--features", f"{store.path}:regions", "--d", "16",
                       "--batch-size", "8", "--epochs", "1", "--device", "cpu", "--val-images", "4",
                       "--out", str(run)]) == 0
    assert train_main(["evaluate", "--run", str(run), "--device", "cpu"]) == 0
    before = json.loads((run / "eval" / "test_best.json").read_text())
    assert main(["recompress", str(store.path), "--codec", "lz4", "--out", str(tmp_path / "l.zarr")]) == 0
    store.path.rename(tmp_path / "zstd.zarr")
    (tmp_path / "l.zarr").rename(store.path)  # the copy where the run's config says its store is
    capsys.readouterr()
    assert train_main(["evaluate", "--run", str(run), "--device", "cpu", "--overwrite"]) == 0
    assert FeatureStore(store.path).attrs["codec"] == "lz4"
    assert json.loads((run / "eval" / "test_best.json").read_text()) == before


def test_recompress_out_is_never_a_dangling_link_nor_a_store_holding_a_users_file(tmp_path: Path,
                                                                                    capsys) -> None:
    """issue 41.5: `--out` a symbolic link to nowhere was a NotADirectoryError traceback (after the copy was
    built beside it); `--overwrite` onto a copy holding a NOTES.txt deleted the note with the copy. Both
    are one line now, and nothing is written or deleted; the copy's own files alone are replaced."""
    source = make_store(tmp_path / "z.zarr", "zstd")
    link, nowhere = tmp_path / "o.zarr", tmp_path / "nowhere"
    link.symlink_to(nowhere)
    argv = ["recompress", str(source.path), "--codec", "lz4", "--out"]
    assert main([*argv, str(link)]) == 2
    assert capsys.readouterr().err.strip() == (f"features: error: --out {link}: is a symbolic link to "
                                               f"{nowhere}, which does not exist; remove the link or give "
                                               "another folder")
    assert link.is_symlink() and not nowhere.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".o.zarr")] == []
    out = tmp_path / "l.zarr"
    assert main([*argv, str(out)]) == 0
    before = FeatureStore(out).attrs["generation"]
    for note in ("NOTES.txt", "regions/NOTES.txt", "regions/c/1/notes", "fne"):
        (out / note).write_text("mine")
        capsys.readouterr()
        assert main([*argv, str(out), "--overwrite"]) == 2, note
        err = capsys.readouterr().err.strip()
        assert err == (f"features: error: {out}: a feature store, but it also holds '{note}', which features "
                       "did not write; refusing to replace it (move that away, or give another --out)"), err
        assert (out / note).read_text() == "mine" and FeatureStore(out).attrs["generation"] == before
        (out / note).unlink()
    assert main([*argv, str(out), "--overwrite"]) == 0  # only its own files: replaced
    assert FeatureStore(out).attrs["generation"] != before and verify_store(out).ok
