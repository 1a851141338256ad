"""Checkpointer: round trips, async saves, retention, partial reads, faults, interop.

Every test asserts exact values. Local-path tests exercise the tensorstore
write engine; ``memory://`` tests exercise the zarr-python engine (the path
object stores take).
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import fsspec
import numpy as np
import pytest
import tensorstore as ts
import zarr

from core.checkpoint import Checkpointer, CheckpointError

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def make_state(seed: int) -> dict:
    """A learner-like nested state; every value is a function of ``seed``."""
    rng = np.random.default_rng(seed)
    return {
        "params": {"q": {"dense_0": {"kernel": rng.standard_normal((64, 32)).astype(np.float32),
                                     "bias": np.full(32, seed, np.float32)}}},
        "target_params": {"q": {"dense_0": {"kernel": np.arange(2048, dtype=np.float32)
                                            .reshape(64, 32) + seed}}},
        "opt": {"count": np.int64(seed), "mu": np.arange(10, dtype=np.int64) * seed},
        "counters": {"step": 100 * seed, "lr": 0.5 * seed, "done": seed % 2 == 0},
        "rng": np.array([seed, 7], dtype=np.uint64),
        "mask": np.array([True, False, seed % 2 == 1]),
    }


def assert_state_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, w in want.items():
        g = got[k]
        if isinstance(w, dict):
            assert_state_equal(g, w)
        elif isinstance(w, (bool, int, float)):
            assert type(g) is type(w) and g == w, k
        else:
            w = np.asarray(w)
            assert g.dtype == w.dtype and g.shape == w.shape, k
            np.testing.assert_array_equal(g, w)


@pytest.fixture
def mem_url():
    url = f"memory://ckpt-tests/{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url[len("memory://"):]):
        fs.rm(url[len("memory://"):], recursive=True)


@pytest.fixture(params=["local", "memory"])
def url(request, tmp_path, mem_url):
    return str(tmp_path / "ckpt") if request.param == "local" else mem_url


def chunk_file(root: str, step: int, var: str, chunk: str) -> str:
    return os.path.join(root, f"step_{step:08d}", var, chunk)


def flip_byte(path: str, offset: int = 5) -> None:
    data = bytearray(pathlib.Path(path).read_bytes())
    data[offset] ^= 0xFF
    pathlib.Path(path).write_bytes(bytes(data))


# ------------------------------------------------------------------ round trips
def test_round_trip_nested_state_and_metadata(url):
    meta = {"config": {"agent": "dqn", "lr": 1e-3}, "replay_version": 17}
    with Checkpointer(url) as ckpt:
        ckpt.save(3, make_state(3), metadata=meta)
        ckpt.wait()
        assert ckpt.all_steps() == [3]
        state, got_meta = ckpt.restore()
    assert got_meta == meta
    assert_state_equal(state, make_state(3))


def test_tf_variables_are_copied_at_save_time(tmp_path):
    tf = pytest.importorskip("tensorflow")
    v = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    with Checkpointer(str(tmp_path / "c")) as ckpt:
        ckpt.save(1, {"params": {"v": v}, "step": tf.constant(5, tf.int64)})
        v.assign(tf.zeros((2, 3)))  # mutating after save() must not leak into the checkpoint
        state, _ = ckpt.restore(1)
    np.testing.assert_array_equal(state["params"]["v"],
                                  np.arange(6, dtype=np.float32).reshape(2, 3))
    assert state["step"].dtype == np.int64 and state["step"] == 5


def test_same_step_saved_twice_leaves_one_checkpoint_with_new_values(url):
    with Checkpointer(url) as ckpt:
        ckpt.save(5, make_state(1))
        ckpt.save(5, make_state(2))
        ckpt.wait()
        assert ckpt.all_steps() == [5]
        assert_state_equal(ckpt.restore(5)[0], make_state(2))


# -------------------------------------------------------------------------- async
def test_save_returns_before_write_and_next_save_waits(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "c"))
    release, entered = threading.Event(), threading.Event()
    real_write = ckpt._writer.write

    def blocked_write(jobs):
        entered.set()
        assert release.wait(30)
        real_write(jobs)

    ckpt._writer.write = blocked_write
    state = make_state(1)
    ckpt.save(1, state)  # returns although the writer is blocked
    assert entered.wait(10)
    assert ckpt.all_steps() == []  # nothing committed yet
    state["params"]["q"]["dense_0"]["bias"][:] = -1  # caller mutates right after save()

    second = threading.Thread(target=ckpt.save, args=(2, make_state(2)))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # save(2) waits for save(1)
    release.set()
    second.join(30)
    assert not second.is_alive()
    ckpt.close()
    assert ckpt.all_steps() == [1, 2]
    assert_state_equal(Checkpointer(str(tmp_path / "c")).restore(1)[0], make_state(1))


@pytest.mark.parametrize("surface", ["save", "wait", "close"])
def test_background_error_is_reraised_at_next_call(mem_url, surface):
    ckpt = Checkpointer(mem_url)

    def failing_write(jobs):
        raise OSError("disk full")

    ckpt._writer.write = failing_write
    ckpt.save(7, make_state(1))  # the failure happens in the background
    with pytest.raises(CheckpointError, match=r"step 7 .*OSError: disk full"):
        getattr(ckpt, surface)(*((8, make_state(2)) if surface == "save" else ()))
    assert ckpt.all_steps() == []
    if surface != "close":  # the error is reported once; the checkpointer stays usable
        del ckpt._writer.write
        ckpt.save(9, make_state(3))
        ckpt.wait()
        assert ckpt.all_steps() == [9]
    ckpt.close()


# ---------------------------------------------------------------------- retention
@pytest.mark.parametrize("keep_last, keep_every, expected", [
    (2, 4, [4, 8, 9, 10]),
    (3, None, [8, 9, 10]),
    (1, 5, [5, 10]),
    (None, None, list(range(1, 11))),
])
def test_retention_keeps_last_k_plus_every_m(mem_url, keep_last, keep_every, expected):
    with Checkpointer(mem_url, keep_last=keep_last, keep_every=keep_every) as ckpt:
        for step in range(1, 11):
            ckpt.save(step, {"x": np.array([step])})
    assert Checkpointer(mem_url).all_steps() == expected


def test_retention_never_deletes_newest_complete_and_collects_debris(tmp_path):
    root = str(tmp_path / "c")
    with Checkpointer(root, keep_last=1) as ckpt:
        ckpt.save(10, {"x": np.array([10])})
        ckpt.wait()
        os.makedirs(os.path.join(root, "step_00000020", "x", "c"))  # a killed save's debris
        ckpt.save(5, {"x": np.array([5])})  # an older step saved after a newer one
    assert Checkpointer(root).all_steps() == [5, 10]
    assert not os.path.exists(os.path.join(root, "step_00000020"))


# ------------------------------------------------------------------------ restore
def test_restore_given_step_subset_and_missing_step(url):
    with Checkpointer(url, keep_last=None) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, make_state(step), metadata={"s": step})
        ckpt.wait()
        assert ckpt.latest_step() == 3
        state, meta = ckpt.restore(2, select=["params", "counters/step"])
        assert meta == {"s": 2}
        assert state.keys() == {"params", "counters"}
        assert state["counters"] == {"step": 200}
        assert_state_equal(state["params"], make_state(2)["params"])
        with pytest.raises(CheckpointError, match=r"^step 4 not found .*\[1, 2, 3\]$"):
            ckpt.restore(4)
        with pytest.raises(CheckpointError, match="no variable matches 'nope'"):
            ckpt.restore(select=["nope"])


def test_restore_subset_does_not_read_other_variables(tmp_path):
    root = str(tmp_path / "c")
    with Checkpointer(root) as ckpt:
        ckpt.save(1, make_state(1))
    # Corrupt every chunk of every unselected variable: reading any of them would fail.
    step_dir = os.path.join(root, "step_00000001")
    corrupted = 0
    for dirpath, _, files in os.walk(step_dir):
        rel = os.path.relpath(dirpath, step_dir)
        if rel.startswith(os.path.join("params", "q", "dense_0", "kernel")):
            continue
        for f in files:  # chunk keys: "c/i/j" for n-d arrays, "c" for 0-d arrays
            if f == "c" or "c" in rel.split(os.sep):
                pathlib.Path(dirpath, f).write_bytes(b"garbage")
                corrupted += 1
    assert corrupted == 9  # every chunk of the 9 unselected variables
    state, _ = Checkpointer(root).restore(select=["params/q/dense_0/kernel"])
    np.testing.assert_array_equal(state["params"]["q"]["dense_0"]["kernel"],
                                  make_state(1)["params"]["q"]["dense_0"]["kernel"])
    with pytest.raises(CheckpointError, match="checksum/decode failure"):
        Checkpointer(root).restore(select=["target_params"])


def test_read_variable_slice_reads_only_its_chunks(tmp_path):
    root = str(tmp_path / "c")
    with Checkpointer(root, target_chunk_bytes=2048) as ckpt:  # (64, 32) f32 -> 4 chunks of 16 rows
        ckpt.save(1, make_state(1))
    var = "target_params/q/dense_0/kernel"
    for i in (1, 2, 3):
        flip_byte(chunk_file(root, 1, var, f"c/{i}/0"))
    got = Checkpointer(root).read_variable(var, index=np.s_[2:16, 3])
    np.testing.assert_array_equal(got, np.arange(2, 16) * 32 + 3 + 1.0)


# ------------------------------------------------------------------------- faults
def test_flipped_byte_gives_one_line_checksum_error(tmp_path):
    root = str(tmp_path / "c")
    with Checkpointer(root, target_chunk_bytes=2048) as ckpt:
        ckpt.save(3, make_state(3))
    var = "params/q/dense_0/kernel"
    flip_byte(chunk_file(root, 3, var, "c/1/0"))
    with pytest.raises(CheckpointError) as err:
        Checkpointer(root).restore()
    msg = str(err.value)
    assert "\n" not in msg
    assert "step 3" in msg and repr(var) in msg and "chunk 'c/1/0'" in msg and "checksum" in msg


CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    sys.path.insert(0, {repo!r})
    from core.checkpoint import Checkpointer
    url, ready = sys.argv[1], sys.argv[2]
    ckpt = Checkpointer(url, target_chunk_bytes=1024)
    ckpt.save(1, {{"w": np.full((256, 64), 1.0, np.float32), "step": 1}})
    ckpt.wait()
    real_write = ckpt._writer.write
    def write_half_then_hang(jobs):
        real_write(jobs[:1])  # some arrays of step 2 are on disk, the rest never will be
        open(ready, "w").close()
        time.sleep(600)
    ckpt._writer.write = write_half_then_hang
    ckpt.save(2, {{"w": np.full((256, 64), 2.0, np.float32), "step": 2}})
    time.sleep(600)
""")


def test_sigkill_mid_save_leaves_previous_checkpoint(tmp_path):
    root, ready = str(tmp_path / "c"), str(tmp_path / "ready")
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(repo=REPO))
    child = subprocess.Popen([sys.executable, str(script), root, ready])
    try:
        deadline = time.time() + 60
        while not os.path.exists(ready):
            assert child.poll() is None and time.time() < deadline, "child failed to start"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    assert os.path.isdir(chunk_file(root, 2, "w", "c"))  # partial data of step 2 exists...
    with pytest.raises(zarr.errors.GroupNotFoundError):
        zarr.open_group(os.path.join(root, "step_00000002"), mode="r")  # ...invisible to zarr
    ckpt = Checkpointer(root)
    assert ckpt.all_steps() == [1]
    state, _ = ckpt.restore()
    assert state["step"] == 1
    np.testing.assert_array_equal(state["w"], np.full((256, 64), 1.0, np.float32))
    ckpt.save(2, {"w": np.zeros((2,), np.float32), "step": 2})  # the retry overwrites the debris
    ckpt.close()
    assert ckpt.all_steps() == [1, 2] and ckpt.restore(2)[0]["step"] == 2


def _tree(root: str) -> list:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("setup, pattern", [
    ("foreign_dir", r"not a DataBloom checkpoint directory \(no zarr.json"),
    ("file", "is a file, not a checkpoint directory"),
    ("zarr_group", r"is a zarr node but not a DataBloom checkpoint directory"),
    ("newer_root", r"schema version 99; this DataBloom reads versions <= 1"),
])
def test_bad_paths_give_one_line_error_and_delete_nothing(tmp_path, setup, pattern):
    root = str(tmp_path / "c")
    if setup == "file":
        pathlib.Path(root).write_text("hello")
    else:
        os.makedirs(root)
        pathlib.Path(root, "notes.txt").write_text("keep me")
        if setup == "zarr_group":
            zarr.open_group(root, mode="w").attrs["x"] = 1
        elif setup == "newer_root":
            doc = {"zarr_format": 3, "node_type": "group",
                   "attributes": {"databloom_checkpoints": {"schema_version": 99}}}
            pathlib.Path(root, "zarr.json").write_text(json.dumps(doc))
    before = _tree(root) if os.path.isdir(root) else pathlib.Path(root).read_text()
    with pytest.raises(CheckpointError, match=pattern) as err:
        Checkpointer(root)
    assert "\n" not in str(err.value)
    assert (_tree(root) if os.path.isdir(root) else pathlib.Path(root).read_text()) == before


def test_step_with_newer_schema_is_refused(tmp_path):
    root = str(tmp_path / "c")
    with Checkpointer(root) as ckpt:
        ckpt.save(1, {"x": np.arange(3)})
    marker = os.path.join(root, "step_00000001", "zarr.json")
    doc = json.loads(pathlib.Path(marker).read_text())
    doc["attributes"]["databloom_checkpoint"]["schema_version"] = 2
    pathlib.Path(marker).write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=r"^step 1 in .* schema version 2; .* <= 1"):
        Checkpointer(root).restore()
    assert os.path.exists(marker)


@pytest.mark.parametrize("state, metadata, pattern", [
    ({"a/b": np.zeros(2)}, None, "invalid state key 'a/b'"),
    ({"x": np.array(["s"])}, None, "variable 'x' has unsupported dtype <U1"),
    ({"x": 2 ** 70}, None, "variable 'x' has unsupported dtype object"),
    ({"x": np.zeros(2)}, {"f": object()}, "metadata must be JSON-serializable"),
])
def test_bad_state_is_rejected_in_the_callers_thread(mem_url, state, metadata, pattern):
    with Checkpointer(mem_url) as ckpt:
        with pytest.raises(CheckpointError, match=pattern):
            ckpt.save(1, state, metadata)
        assert ckpt.all_steps() == []


# ---------------------------------------------------------------------- interop
@pytest.mark.parametrize("engine", ["tensorstore", "zarr"])
def test_plain_zarr_and_tensorstore_read_the_checkpoint(tmp_path, engine):
    root = str(tmp_path / "c")
    want = make_state(4)
    with Checkpointer(root, engine=engine, target_chunk_bytes=2048) as ckpt:
        ckpt.save(4, want, metadata={"config": {"a": 1}})
    group = zarr.open_group(os.path.join(root, "step_00000004"), mode="r")
    assert group.attrs["databloom_checkpoint"]["metadata"] == {"config": {"a": 1}}
    kernel = want["params"]["q"]["dense_0"]["kernel"]
    np.testing.assert_array_equal(group["params/q/dense_0/kernel"][...], kernel)
    np.testing.assert_array_equal(group["mask"][...], want["mask"])
    assert group["counters/step"][...] == 400 and group["counters/step"].dtype == np.int64
    assert zarr.open_group(root, mode="r")["step_00000004/rng"].dtype == np.uint64
    spec = {"driver": "zarr3", "kvstore": {
        "driver": "file", "path": os.path.join(root, "step_00000004", "params/q/dense_0/kernel/")}}
    np.testing.assert_array_equal(ts.open(spec).result().read().result(), kernel)
    spec["kvstore"]["path"] = os.path.join(root, "step_00000004", "opt/mu/")
    np.testing.assert_array_equal(ts.open(spec).result().read().result(), want["opt"]["mu"])


def test_memory_url_is_readable_by_plain_zarr(mem_url):
    with Checkpointer(mem_url) as ckpt:
        ckpt.save(2, make_state(2))
    group = zarr.open_group(f"{mem_url}/step_00000002", mode="r")
    np.testing.assert_array_equal(group["target_params/q/dense_0/kernel"][...],
                                  make_state(2)["target_params"]["q"]["dense_0"]["kernel"])


def test_donated_arrays_are_written_without_a_copy(tmp_path):
    from core.checkpoint.layout import flatten
    state = {"params": {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, "step": 7}
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    host, _ = ckpt._snapshot(flatten(state), donate=True)
    assert host["params/w"] is state["params"]["w"]          # handed over, not copied
    copied, _ = ckpt._snapshot(flatten(state), donate=False)
    assert copied["params/w"] is not state["params"]["w"]
    ckpt.save(3, state, donate=True)
    ckpt.wait()
    restored, _ = ckpt.restore(3)
    np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
    assert restored["step"] == 7
    ckpt.close()


@pytest.mark.slow
def test_dask_workers_write_the_chunks_and_restore_is_exact(tmp_path):
    """engine='dask': each large variable is split into chunk-aligned slabs that worker processes write."""
    from distributed import Client, LocalCluster
    rng = np.random.default_rng(0)
    state = {"params": {"w": rng.standard_normal((4096, 64)).astype(np.float32),     # 1 MiB: 16 chunks
                        "b": rng.standard_normal(64).astype(np.float32)},
             "counters": {"steps": np.int64(7)}}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        ckpt = Checkpointer(str(tmp_path / "ck"), engine="dask", dask_client=client,
                            target_chunk_bytes=64 << 10)
        ckpt.save(1, state)
        ckpt.wait()
        assert ckpt._writer.slab_tasks == 3                       # w in 2 slabs, b in 1: on the workers
        ckpt.close()
    restored, _ = Checkpointer(str(tmp_path / "ck")).restore(1)
    np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
    np.testing.assert_array_equal(restored["params"]["b"], state["params"]["b"])
    assert int(restored["counters"]["steps"]) == 7
    z = zarr.open_group(str(tmp_path / "ck" / "step_00000001"), mode="r")   # plain zarr: all chunks there
    np.testing.assert_array_equal(z["params/w"][...], state["params"]["w"])
    with pytest.raises(CheckpointError, match="engine='dask' and dask_client go together"):
        Checkpointer(str(tmp_path / "ck2"), engine="dask")
