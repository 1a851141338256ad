"""ReplayStore: aggregation, commits, snapshots, retention/gc, cache, bad input (memory:// and local)."""
import json
import os

import fsspec
import numpy as np
import pytest

from replay_fakes import random_batch
from core.replay import (ChecksumError, NStepSampler, ReplayCache, ReplayError, ReplayStore,
                         ShardAggregator)
from core.replay.schema import SCHEMA_VERSION


def test_aggregator_groups_by_target_bytes():
    batches = [random_batch(i, T=16, E=2) for i in range(7)]
    size = batches[0].nbytes
    agg = ShardAggregator(target_bytes=3 * size)
    groups = [g for b in batches for g in agg.add(b)]
    assert [len(g) for g in groups] == [3, 3] and agg.pending_bytes == size
    rest = agg.flush()
    assert [len(g) for g in rest] == [1] and agg.flush() == []
    assert [b.seed for g in groups + rest for b in g] == list(range(7))


def test_write_shards_aggregates_with_deterministic_ids(store_url):
    store = ReplayStore.open_or_create(store_url, env_id="CartPole-v1")
    batches = [random_batch(i, T=16, E=2) for i in range(5)]
    infos = store.write_shards("r000003", batches, target_bytes=2 * batches[0].nbytes)
    assert [i.id for i in infos] == ["r000003-g0000", "r000003-g0001", "r000003-g0002"]
    assert [i.rows for i in infos] == [64, 64, 32]
    assert store.latest_version() == 0 and store.snapshot().shards == []  # not committed yet


def test_commit_is_atomic_idempotent_and_versioned(store_url):
    store = ReplayStore.open_or_create(store_url, env_id="CartPole-v1")
    a = store.write_shard("r0-g0", [random_batch(0)])
    b = store.write_shard("r0-g1", [random_batch(1)])
    with pytest.raises(ReplayError, match="'r0-g2' is missing or incompletely written"):
        store.commit(["r0-g0", "r0-g2"])  # one bad id: nothing becomes visible
    assert store.latest_version() == 0
    assert store.commit([a.id, b.id], meta={"round": 0}) == 1
    assert store.commit([a.id, b.id]) == 1 and store.commit([b.id]) == 1  # no-op
    assert store.log.entry(1)["meta"] == {"round": 0}
    c = store.write_shard("r1-g0", [random_batch(2)])
    assert store.commit([a.id, c.id]) == 2  # only the new one is added
    assert [s.id for s in store.snapshot().shards] == [a.id, b.id, c.id]
    assert [s.id for s in store.snapshot(1).shards] == [a.id, b.id]
    assert store.snapshot(0).shards == []
    with pytest.raises(ReplayError, match="version 5 does not exist; valid: 0..2"):
        store.snapshot(5)
    reopened = ReplayStore.open(store_url)
    assert reopened.latest_version() == 2 and reopened.env_id == "CartPole-v1"


def test_snapshot_fields_attrs_and_episode_index(store_url):
    store = ReplayStore.open_or_create(store_url, env_id="CartPole-v1")
    batches = [random_batch(0), random_batch(1)]
    store.commit([store.write_shard("s0", batches[:1], attrs={"round": 0}).id,
                  store.write_shard("s1", batches[1:]).id])
    snap = store.snapshot()
    rows = [b.flat_rows() for b in batches]
    for name in ("observation", "reward", "terminated", "episode_id", "extras/logits"):
        np.testing.assert_array_equal(snap.field(name).compute(), np.concatenate([r[name] for r in rows]))
    attrs = snap.shard_attrs("s0")
    assert attrs["schema_version"] == SCHEMA_VERSION and attrs["env_id"] == "CartPole-v1"
    assert attrs["rows"] == 256 and attrs["fields"]["observation"] == {"dtype": "float32", "shape": [4]}
    assert attrs["attrs"] == {"round": 0} and attrs["task_ids"] == ["task0"] and attrs["seeds"] == [0]
    ep = snap.reader("s0").episodes()
    r = rows[0]
    assert ep["start"][0] == 0 and ep["length"].sum() == 256
    for s, n, e in zip(ep["start"], ep["length"], ep["end"]):
        assert np.all(r["episode_id"][s:s + n] == r["episode_id"][s])
        assert e == (1 if r["terminated"][s + n - 1] else 2 if r["truncated"][s + n - 1] else 0)
    np.testing.assert_allclose(ep["return"], np.add.reduceat(r["reward"].astype(np.float64), ep["start"]))
    ds = snap.to_xarray(["reward", "extras/logits"])
    assert ds["reward"].shape == (512,) and ds["extras.logits"].shape == (512, 2)
    assert snap.cache.nbytes > 0


def test_retried_task_overwrites_uncommitted_and_committed_is_kept(store_url):
    store = ReplayStore.open_or_create(store_url)
    store.write_shard("r0-g0", [random_batch(0, T=128)])   # first attempt (larger)
    second = store.write_shard("r0-g0", [random_batch(1, T=32)])  # retry with other data
    assert store.commit(["r0-g0"]) == 1 and store.commit(["r0-g0"]) == 1
    again = store.write_shard("r0-g0", [random_batch(2)])   # retry after commit: no-op
    assert again == second
    snap = store.snapshot()
    assert [s.id for s in snap.shards] == ["r0-g0"] and snap.num_rows == 128
    np.testing.assert_array_equal(snap.field("reward").compute(), random_batch(1, T=32).flat_rows()["reward"])


def test_open_errors_are_one_line_and_delete_nothing(tmp_path):
    plain = tmp_path / "not_a_store"
    plain.mkdir()
    (plain / "data.txt").write_text("keep me")
    for call in (lambda: ReplayStore.open(str(plain)), lambda: ReplayStore.open_or_create(str(plain))):
        with pytest.raises(ReplayError) as e:
            call()
        assert "\n" not in str(e.value) and str(plain) in str(e.value)
    with pytest.raises(ReplayError, match="is not a DataBloom replay store"):
        ReplayStore.open(str(tmp_path / "absent"))
    assert (plain / "data.txt").read_text() == "keep me" and not (tmp_path / "absent").exists()
    url = str(tmp_path / "newer")
    ReplayStore.open_or_create(url, env_id="CartPole-v1")
    marker = json.loads((tmp_path / "newer" / "replay.json").read_text())
    (tmp_path / "newer" / "replay.json").write_text(json.dumps({**marker, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(ReplayError, match="schema version 2, newer than this DataBloom reads") as e:
        ReplayStore.open_or_create(url)
    assert "\n" not in str(e.value) and os.listdir(tmp_path / "newer") == ["replay.json"]
    (tmp_path / "newer" / "replay.json").write_text(json.dumps(marker))
    with pytest.raises(ReplayError, match="holds env 'CartPole-v1', not 'Pong'"):
        ReplayStore.open_or_create(url, env_id="Pong")
    with pytest.raises(ReplayError, match="invalid shard id"):
        ReplayStore.open(url).write_shard("../x", [random_batch(0)])


def test_retention_is_a_log_entry_and_gc_deletes_data(store_url):
    store = ReplayStore.open_or_create(store_url)
    for i in range(4):
        store.commit([store.write_shard(f"s{i}", [random_batch(i, T=32, E=2)]).id])  # 64 rows each
    store.write_shard("o0", [random_batch(9, T=8, E=1)])  # never committed
    assert store.apply_retention(max_transitions=150) == 5
    assert store.log.entry(5)["op"] == "remove" and store.log.entry(5)["shards"] == ["s0", "s1"]
    assert [s.id for s in store.snapshot().shards] == ["s2", "s3"]
    assert store.apply_retention(max_transitions=150) == 5  # nothing more to remove
    assert [s.id for s in store.snapshot(4).shards] == ["s0", "s1", "s2", "s3"]
    report = store.gc(grace_seconds=3600)
    assert report.removed == [] and report.uncommitted == []  # within the grace period
    report = store.gc(grace_seconds=0)
    assert sorted(report.removed) == ["s0", "s1"] and report.uncommitted == ["o0"]
    fs, path = fsspec.core.url_to_fs(store.shards_url)
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)) == ["s2", "s3"]
    with pytest.raises(ReplayError, match="committed shard 's0' has no data .*deleted by gc"):
        store.snapshot(4).read("s0", "reward")
    assert store.snapshot().field("reward").shape == (128,)


def test_cache_fifo_eviction_and_links_across_evicted_rows(store_url):
    store = ReplayStore.open_or_create(store_url)
    cache = ReplayCache(store, max_transitions=300)
    sampler = NStepSampler(cache, n=3, gamma=0.9)
    for i in range(5):
        store.commit([store.write_shard(f"s{i}", [random_batch(i, T=32, E=4)]).id])  # 128 rows each
        cache.refresh()
    assert cache.size == 300 and cache.inserted == 640
    live = cache.data["policy_version"][cache.alive]
    assert sorted(set(live)) == [2, 3, 4] and np.count_nonzero(live == 2) == 44  # oldest rows went first
    batch = sampler.sample(2000, np.random.default_rng(0))
    assert np.all(cache.is_current(batch["index"]))
    assert cache.refresh() == 0


def test_cache_bounds_bytes_and_skips_backlog(store_url):
    store = ReplayStore.open_or_create(store_url)
    ids = [store.write_shard(f"s{i}", [random_batch(i, T=32, E=4)]).id for i in range(4)]
    store.commit(ids)
    row_bytes = random_batch(0, T=1, E=1).nbytes
    cache = ReplayCache(store, max_transitions=10_000, max_bytes=200 * row_bytes)
    assert cache.refresh() == 256  # s2, s3 only: older shards would be evicted at once
    assert cache.capacity == 200 and cache.size == 200 and set(cache.skipped) == {"s0", "s1"}


def test_quarantine_hides_shard(store_url):
    store = ReplayStore.open_or_create(store_url)
    store.commit([store.write_shard(f"s{i}", [random_batch(i)]).id for i in range(2)])
    cache = ReplayCache(store)
    cache.refresh()
    assert store.quarantine("s0", "bad rewards") == 2
    assert [s.id for s in store.snapshot().shards] == ["s1"]
    assert store.state().quarantined == {"s0": "bad rewards"}
    cache.refresh()
    assert set(cache.data["policy_version"][cache.alive]) == {1}
    assert set(NStepSampler(cache).sample(500, np.random.default_rng(0))["policy_version"]) == {1}
    with pytest.raises(ReplayError, match="never committed"):
        store.quarantine("s9", "x")


def _flip_byte(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(path, "wb").write(bytes(data))


def test_flipped_byte_gives_checksum_error_naming_shard_array_chunk(tmp_path):
    store = ReplayStore.open_or_create(str(tmp_path / "r"), chunk_bytes=2048)  # 128 rows of obs per chunk
    store.commit([store.write_shard(f"s{i}", [random_batch(i)]).id for i in range(2)])
    _flip_byte(tmp_path / "r" / "shards" / "s0" / "observation" / "c" / "1" / "0")
    with pytest.raises(ChecksumError) as e:
        store.snapshot().read_shard("s0")
    msg = str(e.value)
    assert "'s0'" in msg and "'observation'" in msg and "'c/1/0'" in msg and "\n" not in msg
    np.testing.assert_array_equal(store.snapshot().read("s0", "reward"), random_batch(0).flat_rows()["reward"])
    cache = ReplayCache(store)
    with pytest.warns(RuntimeWarning, match="checksum error in replay shard 's0', array 'observation'"):
        cache.refresh()
    assert "s0" in store.state().quarantined and cache.size == 256  # s1 loaded, s0 skipped
    assert [s.id for s in store.snapshot().shards] == ["s1"]
