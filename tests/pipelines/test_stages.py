"""Stages as plain functions: shard ids, write + commit + retention + gc."""
import numpy as np

from core.replay import ReplayStore
from core.actor import ActorSpec
from core.rollout import release_actors, run_rollout_task
from core.trajectory import TrajectoryBatch
from pipelines.run import stages


def _batch(t, e, first_episode):
    z = np.zeros((t, e), bool)
    return TrajectoryBatch(
        observation=np.zeros((t, e, 4), np.float32), action=np.zeros((t, e), np.int64),
        reward=np.ones((t, e), np.float32), discount=np.ones((t, e), np.float32), terminated=z, truncated=z,
        episode_id=np.tile(np.arange(e) + first_episode, (t, 1)),
        step=np.tile(np.arange(t)[:, None], (1, e)).astype(np.int32), policy_version=np.zeros((t, e), np.int64))


def test_shard_ids_are_deterministic():
    assert stages.shard_id_for(0) == "s00000000"
    assert stages.shard_id_for(1234) == "s00001234"


def test_commit_with_retention_is_fifo_and_gc_deletes_removed_data(tmp_path):
    store = ReplayStore.open_or_create(str(tmp_path / "replay"), env_id="CartPole-v1")
    for i in range(5):
        store.write_shard(f"s{i}", [_batch(10, 10, 100 * i)])      # 100 rows each
        stages.commit_stage(store, [f"s{i}"], retention_transitions=250)
    assert [s.id for s in store.snapshot().shards] == ["s3", "s4"]  # 200 rows <= 250
    # commits: 5 adds + 3 removals (after s2, s3, s4); data of s0..s2 stays until GC
    assert store.latest_version() == 8
    assert stages.gc_stage(store, grace_seconds=0.0) == {"removed": 3, "uncommitted": 0}
    assert [s.id for s in store.snapshot().shards] == ["s3", "s4"]


def test_write_shard_stage_aggregates_rollout_results(tmp_path):
    from core.networks import mlp
    from core.quantize import PolicyQuantizer
    payload = PolicyQuantizer("int8-dynamic").quantize(mlp(4, [16], 2, seed=0), version=1)
    spec = ActorSpec("stage-test", "CartPole-v1", 4, seed=0, actor_id=0)
    results = [run_rollout_task(spec, payload, k, 16, {"epsilon": 0.5}) for k in range(3)]
    release_actors("stage-test")
    url = str(tmp_path / "replay")
    ReplayStore.open_or_create(url, env_id="CartPole-v1")
    out = stages.write_shard_stage(url, "s00000000", results)
    assert out["rows"] == 3 * 16 * 4 and out["nbytes"] > 0
    store = ReplayStore.open(url)
    assert store.snapshot().shards == []                 # invisible until committed
    assert stages.commit_stage(store, ["s00000000"]) == 1
    assert stages.commit_stage(store, ["s00000000"]) == 1  # idempotent
    assert store.snapshot().num_rows == 192


class _Result:
    def __init__(self, batch):
        self.batch = batch


def test_write_shard_stage_keeps_one_writer_per_process_and_applies_writer_options(tmp_path):
    import json
    url = str(tmp_path / "replay")
    ReplayStore.open_or_create(url, env_id="CartPole-v1")
    options = {"chunk_bytes": 4096, "threads": 1}
    stages.write_shard_stage(url, "s00000000", [_Result(_batch(64, 4, 0))], options)
    writer = stages._worker_store(url, options).writer
    kept = writer._buffers.free_bytes
    assert kept > 0                                        # the shard's buffer is kept for the next one
    stages.write_shard_stage(url, "s00000001", [_Result(_batch(64, 4, 10))], options)
    assert stages._worker_store(url, options).writer is writer and writer._buffers.free_bytes == kept
    store = ReplayStore.open(url)
    meta = json.loads((tmp_path / "replay" / "shards" / "s00000001" / "observation" / "zarr.json").read_text())
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [256, 4]   # 4096 bytes / 16-byte rows
    stages.commit_stage(store, ["s00000000", "s00000001"])
    np.testing.assert_array_equal(ReplayStore.open(url).snapshot().field("episode_id").compute()[::64],
                                  [0, 1, 2, 3, 10, 11, 12, 13])
    # A store deleted and created again at the same URL is read afresh (only the writer is kept).
    import shutil
    shutil.rmtree(tmp_path / "replay")
    ReplayStore.open_or_create(url, env_id="CartPole-v1")
    assert stages.write_shard_stage(url, "s00000000", [_Result(_batch(8, 2, 50))], options)["rows"] == 16
    fresh = ReplayStore.open(url)
    stages.commit_stage(fresh, ["s00000000"])
    np.testing.assert_array_equal(fresh.snapshot().field("episode_id").compute(), [50] * 8 + [51] * 8)


def test_write_shard_stage_stores_grouped_results_in_the_plans_order(tmp_path):
    """Results of run_rollout_group come as lists, groups in any order: the shard is in (actor, task) order."""
    def result(a, k):
        r = _Result(_batch(2, 1, 10 * a + k))
        r.batch.actor_id, r.batch.task_id = a, f"a{a:04d}-t{k:07d}"
        return r
    shuffled = [[result(2, 0), result(2, 1)], [result(0, 0), result(0, 1)], result(1, 0)]
    assert [r.batch.task_id for r in stages.shard_order(shuffled)] == [
        "a0000-t0000000", "a0000-t0000001", "a0001-t0000000", "a0002-t0000000", "a0002-t0000001"]
    # single results stay in the order given (a dataset collection writes them as they finish)
    single = [result(1, 0), result(0, 0)]
    assert stages.shard_order(single) == single
