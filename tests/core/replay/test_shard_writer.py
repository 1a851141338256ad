"""Shard writer: batch layouts, bad batches, and reuse of its host buffers."""
import dataclasses
import pickle

import numpy as np
import pytest

from replay_fakes import random_batch
from core.replay import ReplayError, ReplayStore
from core.replay.buffers import BufferPool
from core.trajectory import is_env_major, step_buffer


def env_major(batch):
    """The same batch with every field stored env-major, as core.rollout stores it."""
    def relayout(v):
        buf = step_buffer(v.shape[0], v.shape[1], v.shape[2:], v.dtype)
        buf[...] = v
        return buf
    fields = {n: relayout(v) for n, v in batch.fields().items() if not n.startswith("extras/")}
    return dataclasses.replace(batch, **fields, extras={k: relayout(v) for k, v in batch.extras.items()})


def test_step_buffer_is_time_indexed_env_major_and_pickles_that_way():
    buf = step_buffer(5, 3, (2,), np.float32, fill=0)
    buf[1] = np.arange(6, dtype=np.float32).reshape(3, 2)        # time step 1 of all envs
    assert buf.shape == (5, 3, 2) and is_env_major(buf)
    assert buf.base[2, 1].tolist() == [4.0, 5.0]                  # env 2's storage row 1
    batch = env_major(random_batch(0, T=8, E=3))
    copy = pickle.loads(pickle.dumps(batch))
    for name, value in batch.fields().items():
        assert is_env_major(copy.fields()[name]), name
        np.testing.assert_array_equal(copy.fields()[name], value, err_msg=name)
    time_major = pickle.loads(pickle.dumps(random_batch(0, T=8, E=3)))
    assert time_major.observation.flags.c_contiguous                # other layouts pickle as before


@pytest.mark.parametrize("engine", ["tensorstore", "zarr"])
def test_env_major_and_time_major_batches_give_identical_shards(tmp_path, engine):
    batches = [random_batch(i, T=32, E=4) for i in range(3)]
    stores = {layout: ReplayStore.open_or_create(str(tmp_path / layout), env_id="CartPole-v1", engine=engine,
                                                 chunk_bytes=1024)
              for layout in ("time", "env")}
    stores["time"].commit([stores["time"].write_shard("s0", batches).id])
    stores["env"].commit([stores["env"].write_shard("s0", [env_major(b) for b in batches]).id])
    expected = {n: np.concatenate([b.flat_rows()[n] for b in batches]) for n in batches[0].fields()}
    for layout, store in stores.items():
        snap = store.snapshot()
        for name, value in expected.items():
            np.testing.assert_array_equal(snap.field(name).compute(), value, err_msg=f"{layout}: {name}")
    np.testing.assert_array_equal(stores["time"].snapshot().reader("s0").episodes()["return"],
                                  stores["env"].snapshot().reader("s0").episodes()["return"])


def test_batches_of_different_dtypes_give_one_line_error_and_leave_nothing(store_url):
    store = ReplayStore.open_or_create(store_url, env_id="CartPole-v1")
    store.commit([store.write_shard("k0", [random_batch(0)]).id])
    odd = random_batch(2)
    odd.observation = odd.observation.astype(np.float64)
    with pytest.raises(ReplayError, match=r"field 'observation' of batch 1 is float64\[4\], batch 0's is "
                                          r"float32\[4\]") as err:
        store.write_shard("b0", [random_batch(1), odd])
    assert "\n" not in str(err.value)
    fs, path = store.writer.fs, store.writer.path
    assert not fs.exists(f"{path}/b0")                                  # no half-written attempt left
    assert [s.id for s in store.snapshot().shards] == ["k0"]
    no_extras = dataclasses.replace(random_batch(3), extras={})
    with pytest.raises(ReplayError, match="batch 1 has extras"):
        store.write_shard("b0", [random_batch(1), no_extras])
    with pytest.raises(ReplayError, match=r"come from env \['CartPole-v1', 'Pong'\], the store holds"):
        store.write_shard("b0", [random_batch(1), random_batch(5, env_id="Pong")])
    assert not fs.exists(f"{path}/b0") and [s.id for s in store.snapshot().shards] == ["k0"]


def test_writer_reuses_its_buffer_and_successive_shards_keep_their_own_values(tmp_path):
    store = ReplayStore.open_or_create(str(tmp_path / "replay"), env_id="CartPole-v1")
    first, second = [env_major(random_batch(i, T=64, E=4)) for i in range(2)]
    store.write_shard("s0", [first])
    kept = store.writer._buffers.free_bytes
    assert kept >= first.nbytes                                   # the buffer came back to the pool
    store.write_shard("s1", [second])
    assert store.writer._buffers.free_bytes == kept               # ... and was reused, not grown
    store.commit(["s0", "s1"])
    snap = store.snapshot()
    for shard, batch in (("s0", first), ("s1", second)):
        np.testing.assert_array_equal(snap.reader(shard).read("observation"), batch.flat_rows()["observation"])


def test_buffer_still_referenced_is_never_handed_out_again():
    pool = BufferPool()
    spec = {"x": ((256,), np.float32)}
    with pool.lease(spec) as arrays:
        arrays["x"][:] = 1.0
        held = arrays["x"]                                        # e.g. an engine that still reads it
        del arrays
    assert pool.free_bytes == 0
    with pool.lease(spec) as arrays:
        arrays["x"][:] = 2.0
        del arrays
    assert np.all(held == 1.0) and pool.free_bytes > 0
    with pool.lease({"y": ((64,), np.int8)}) as arrays:          # a smaller lease fits the free buffer
        assert pool.free_bytes == 0 and arrays["y"].shape == (64,)
        del arrays
