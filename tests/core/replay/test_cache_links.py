"""ReplayCache's cross-shard successor links and its tensorstore shard reads, against plain references.

The cache re-resolves episode-segment links at every refresh with vectorized
bookkeeping (``ReplayCache._relink``); here it must give exactly the links of
the direct per-row definition: ``next[s]`` is the slot of the live row
``(episode_id, step + 1)`` that follows slot ``s``, else -1, through FIFO
eviction, out-of-order commits and quarantined shards.
"""
import numpy as np
import pytest

from replay_fakes import batch_from_rows, episode_rows, random_batch
from core.replay import ReplayCache, ReplayStore
from core.replay.shard_reader import ShardReader


def reference_next(cache: ReplayCache) -> np.ndarray:
    """``next`` by definition, for live rows that end a segment inside their shard or continue across."""
    live = np.flatnonzero(cache.alive)
    where = {(int(cache.data["episode_id"][s]), int(cache.data["step"][s])): s for s in live}
    out = np.full(cache.capacity, -1, np.int64)
    for s in live:
        if cache.last[s]:
            continue
        out[s] = where.get((int(cache.data["episode_id"][s]), int(cache.data["step"][s]) + 1), -1)
    return out


def segmented_shards(rng: np.random.Generator, shards: int, streams: int):
    """Shards whose episode segments continue in later shards: (shard id, batch) in write order.

    ``streams`` envs each run episodes one after another; a shard holds a segment of two of them.
    """
    episode = list(range(streams))           # each stream's current episode id
    step = [0] * streams
    out = []
    for i in range(shards):
        segs = []
        for e in rng.choice(streams, size=2, replace=False):
            n = int(rng.integers(3, 12))
            end = "terminated" if rng.random() < 0.2 else ""
            segs.append(episode_rows(episode[e], range(step[e], step[e] + n), [1.0] * n, end))
            step[e] += n
            if end:                          # the stream starts a new episode
                episode[e], step[e] = episode[e] + streams, 0
        out.append((f"s{i:03d}", batch_from_rows(*segs, task_id=f"t{i}")))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_links_match_the_definition_through_eviction_reordering_and_quarantine(tmp_path, seed):
    rng = np.random.default_rng(seed)
    store = ReplayStore.open_or_create(str(tmp_path / "r"))
    shards = segmented_shards(rng, shards=24, streams=3)
    for sid, batch in shards:
        store.write_shard(sid, [batch])
    order = [sid for sid, _ in shards]
    for i in range(0, len(order) - 1, 2):    # continuations sometimes commit before what they continue
        if rng.random() < 0.5:
            order[i], order[i + 1] = order[i + 1], order[i]
    cache = ReplayCache(store, max_transitions=60)      # a few shards: the ring wraps many times
    linked_across = 0
    for k, sid in enumerate(order):
        store.commit([sid])
        if k % 7 == 6:
            store.quarantine(order[k - 1], "test")      # a dropped shard's rows and links go
        cache.refresh()
        want = reference_next(cache)
        got = np.where(cache.alive & ~cache.last, cache.next, -1)
        np.testing.assert_array_equal(got, want, err_msg=f"after committing {sid} (step {k})")
        linked_across += int(np.sum((want >= 0) & (want != (np.arange(cache.capacity) + 1) % cache.capacity)))
        pending = cache.pending_links               # pruned with eviction: only live rows wait for a link
        assert pending["heads"] <= cache.size and pending["tails"] <= cache.size, (sid, pending, cache.size)
    assert linked_across > 0                 # the case under test happened


def test_read_all_goes_through_tensorstore_on_local_disk_and_equals_zarr(tmp_path, monkeypatch):
    store = ReplayStore.open_or_create(str(tmp_path / "r"))
    info = store.write_shard("s0", [random_batch(3, T=40, E=3)])
    reader = ShardReader(store.shards_url, info.id)
    by_zarr = {n: reader.read(n) for n in reader.field_names}
    monkeypatch.setattr(ShardReader, "read", lambda *a, **k: pytest.fail("read_all fell back to zarr-python"))
    got = ShardReader(store.shards_url, info.id).read_all()
    assert list(got) == list(by_zarr)
    for name, arr in by_zarr.items():
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape
        np.testing.assert_array_equal(got[name], arr)
