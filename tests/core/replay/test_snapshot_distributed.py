"""Snapshot fields compute on a real Dask cluster (the lazy arrays pickle)."""
import numpy as np
import pytest

from core.replay import ReplayStore
from core.trajectory import TrajectoryBatch


def _batch(t, e, first_episode):
    z = np.zeros((t, e), bool)
    return TrajectoryBatch(
        observation=np.arange(t * e * 4, dtype=np.float32).reshape(t, e, 4) + first_episode,
        action=np.zeros((t, e), np.int64), reward=np.ones((t, e), np.float32),
        discount=np.ones((t, e), np.float32), terminated=z, truncated=z,
        episode_id=np.tile(np.arange(e) + first_episode, (t, 1)),
        step=np.tile(np.arange(t)[:, None], (1, e)).astype(np.int32), policy_version=np.zeros((t, e), np.int64))


def test_snapshot_field_computes_with_an_active_distributed_client(tmp_path):
    distributed = pytest.importorskip("distributed")
    store = ReplayStore.open_or_create(str(tmp_path / "replay"), env_id="CartPole-v1")
    for i in range(2):
        store.write_shard(f"s{i}", [_batch(8, 2, 100 * i)])
    store.commit(["s0", "s1"])
    snap = store.snapshot()
    expected = snap.field("observation").compute(scheduler="sync")
    with distributed.Client(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None):
        got = snap.field("observation").compute()
    np.testing.assert_array_equal(got, expected)
    assert got.shape == (32, 4)
