"""Shards are plain zarr v3: read them with zarr-python and tensorstore alone, no DataBloom code."""
import json
import os

import fsspec
import numpy as np
import pytest
import tensorstore as ts
import zarr

from replay_fakes import random_batch
from core.replay import ReplayStore

FIELDS = ["observation", "action", "reward", "discount", "terminated", "truncated", "episode_id", "step",
          "policy_version", "extras/logits"]


def _write(url, engine):
    store = ReplayStore.open_or_create(url, env_id="CartPole-v1", engine=engine, chunk_bytes=4096)
    batches = [random_batch(0, T=64, E=4), random_batch(1, T=64, E=4)]
    store.commit([store.write_shard("r000000-g0000", batches).id])
    rows = [b.flat_rows() for b in batches]
    return {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}


def _tensorstore_read(path, name):
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{path}/{name}/"}}).result()
    return arr.read().result()


@pytest.mark.parametrize("engine", ["tensorstore", "zarr"])
def test_local_shard_reads_with_zarr_and_tensorstore(tmp_path, engine):
    expected = _write(str(tmp_path / "r"), engine)
    path = str(tmp_path / "r" / "shards" / "r000000-g0000")
    group = zarr.open_group(path, mode="r")
    attrs = group.attrs["databloom"]
    assert attrs["env_id"] == "CartPole-v1" and attrs["rows"] == 512 and attrs["schema_version"] == 1
    meta = json.load(open(os.path.join(path, "observation", "zarr.json")))
    assert [c["name"] for c in meta["codecs"]] == ["bytes", "zstd", "crc32c"]
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [256, 4]  # 4096 bytes of float32 x4
    for name in FIELDS:
        np.testing.assert_array_equal(group[name][...], expected[name])
        np.testing.assert_array_equal(_tensorstore_read(path, name), expected[name])
    assert int(group["episodes/length"][...].sum()) == 512
    np.testing.assert_array_equal(_tensorstore_read(path, "episodes/start"), group["episodes/start"][...])


def test_memory_shard_reads_with_zarr_and_tensorstore(tmp_path):
    url = "memory://interop-test/replay"
    try:
        expected = _write(url, "auto")
        shard = f"{url}/shards/r000000-g0000"
        group = zarr.open_group(zarr.storage.FsspecStore.from_url(shard, read_only=True), mode="r")
        for name in FIELDS:
            np.testing.assert_array_equal(group[name][...], expected[name])
        fsspec.filesystem("memory").get(shard.split("://", 1)[1], str(tmp_path / "copy"), recursive=True)
        for name in FIELDS:  # the same bytes, read by tensorstore from a local copy
            np.testing.assert_array_equal(_tensorstore_read(str(tmp_path / "copy"), name), expected[name])
    finally:
        fsspec.filesystem("memory").rm("/interop-test", recursive=True)


@pytest.mark.parametrize("engine", ["tensorstore", "zarr"])
def test_frames_straddling_chunks_round_trip(tmp_path, engine):
    """84x84 uint8 frames stream through chunk buffers; 7 frames per chunk, batches straddle chunks."""
    store = ReplayStore.open_or_create(str(tmp_path / "r"), engine=engine, chunk_bytes=50_000)
    batches = [random_batch(i, T=10, E=3, obs_shape=(84, 84), dtype=np.uint8) for i in range(3)]
    store.commit([store.write_shard("f0", batches).id])
    expected = np.concatenate([b.flat_rows()["observation"] for b in batches])
    path = str(tmp_path / "r" / "shards" / "f0")
    assert zarr.open_group(path, mode="r")["observation"].chunks == (7, 84, 84)
    np.testing.assert_array_equal(zarr.open_group(path, mode="r")["observation"][...], expected)
    np.testing.assert_array_equal(_tensorstore_read(path, "observation"), expected)
    np.testing.assert_array_equal(_tensorstore_read(path, "action"),
                                  np.concatenate([b.flat_rows()["action"] for b in batches]))
