"""Faults from issue 2: killed writers, concurrent committers, retried tasks (real processes)."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from replay_fakes import random_batch
from core.replay import ReplayCache, ReplayError, ReplayStore

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PRELUDE = f"import sys, time\nsys.path[:0] = [{REPO!r}, {HERE!r}]\n"


def _python(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


KILLED_WRITER = """
from replay_fakes import random_batch
from core.replay import ReplayStore, shard_writer
store = ReplayStore.open_or_create({url!r})
store.commit([store.write_shard("d0", [random_batch(0)]).id])

def stall(*args, **kwargs):
    print("STALLED", flush=True)
    time.sleep(120)

if {where!r} == "mid-arrays":   # start writing 4 blocks of arrays, then hang
    engine, calls = store.writer.engine, []
    real = engine.write
    def partial(handle, lo, data, **kwargs):
        calls.append(lo)
        if len(calls) > 4:
            stall()
        return real(handle, lo, data, **kwargs)
    engine.write = partial
else:                          # every array written, completion marker not yet
    shard_writer.ShardWriter._attrs = stall
store.write_shard("k0", [random_batch(1, T=256)])
"""


@pytest.mark.parametrize("where", ["mid-arrays", "before-marker"])
def test_writer_sigkilled_mid_shard_leaves_nothing_visible(tmp_path, where):
    url = str(tmp_path / "replay")
    proc = _python(KILLED_WRITER.format(url=url, where=where))
    line = proc.stdout.readline()
    assert line.strip() == "STALLED", proc.stderr.read()
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    store = ReplayStore.open(url)
    assert (tmp_path / "replay" / "shards" / "k0").is_dir()  # partial data exists on disk ...
    assert store.latest_version() == 1 and [s.id for s in store.snapshot().shards] == ["d0"]  # ... unseen
    with pytest.raises(ReplayError, match="'k0' is missing or incompletely written"):
        store.commit(["k0"])
    cache = ReplayCache(store)
    assert cache.refresh() == 256
    assert store.gc(grace_seconds=0).uncommitted == ["k0"]
    store.commit([store.write_shard("k0", [random_batch(1, T=16)]).id])  # the retried task
    assert [s.id for s in store.snapshot().shards] == ["d0", "k0"]


CONCURRENT_COMMITTER = """
import pathlib
from replay_fakes import random_batch
from core.replay import ReplayStore
p, n, url, ready = {p}, {n}, {url!r}, pathlib.Path({ready!r})
store = ReplayStore.open(url)
ids = [store.write_shard(f"p{{p}}-s{{i:03d}}", [random_batch(p, T=2, E=1)]).id for i in range(n)]
(ready / str(p)).touch()
while len(list(ready.iterdir())) < {procs}:   # start committing together
    time.sleep(0.001)
for sid in ids:
    store.commit([sid])
"""


@pytest.mark.slow
def test_eight_processes_commit_fifty_shards_each(tmp_path):
    url, ready, procs, n = str(tmp_path / "replay"), tmp_path / "ready", 8, 50
    ready.mkdir()
    ReplayStore.open_or_create(url, env_id="CartPole-v1")
    workers = [_python(CONCURRENT_COMMITTER.format(p=p, n=n, url=url, ready=str(ready), procs=procs))
               for p in range(procs)]
    for w in workers:
        _, err = w.communicate(timeout=240)
        assert w.returncode == 0, err
    store = ReplayStore.open(url)
    state = store.state()
    expected = {f"p{p}-s{i:03d}" for p in range(procs) for i in range(n)}
    assert state.version == procs * n and set(state.live) == expected and len(state.live) == 400
    added = [sid for v in range(1, state.version + 1) for sid in (d["id"] for d in store.log.entry(v)["shards"])]
    assert len(added) == 400 and len(set(added)) == 400  # none lost, none duplicated
    assert len({store.log.entry(v)["writer"] for v in range(1, 401)}) == procs
    assert store.snapshot().num_rows == 800
    # Log checkpoints written by the racing committers (every 100 versions) match the entries.
    from core.replay.commit_log import CHECKPOINT_EVERY, KEEP_CHECKPOINTS, LogState
    assert (CHECKPOINT_EVERY, KEEP_CHECKPOINTS) == (100, 3) and store.log._base == 400  # from the last one
    full = LogState()
    for v in range(1, 401):
        full.apply(store.log.entry(v))
        if v % 100 == 0:
            kept = store.log._read_checkpoint(v)
            assert (kept is None) if v == 100 else (kept.to_json() == full.to_json()), v  # 100: pruned


def _rollout_task(store, attempt):
    """A rollout task: deterministic shard id, data depends on the attempt (e.g. nondeterministic env)."""
    return store.write_shard("r000003-g0001", [random_batch(10 + attempt, T=16, E=2)])


def test_rerun_task_and_double_commit_leave_one_shard(store_url):
    store = ReplayStore.open_or_create(store_url)
    _rollout_task(store, attempt=0)
    info = _rollout_task(store, attempt=1)             # retried before any commit: overwrites
    v1 = store.commit([info.id], meta={"round": 3})
    v2 = ReplayStore.open(store_url).commit([info.id], meta={"round": 3})  # a second committer
    _rollout_task(store, attempt=2)                    # a zombie retry after the commit: no-op
    assert v1 == v2 == store.latest_version() == 1
    snap = store.snapshot()
    assert [s.id for s in snap.shards] == ["r000003-g0001"]
    np.testing.assert_array_equal(snap.field("observation").compute(),
                                  random_batch(11, T=16, E=2).flat_rows()["observation"])


def test_tensorstore_conditional_create_is_exclusive(tmp_path):
    """The object-store commit primitive (gs://, s3://), exercised on tensorstore's file kvstore."""
    from concurrent.futures import ThreadPoolExecutor
    from core.replay.commit_log import TensorstoreCreator
    creators = [TensorstoreCreator({"driver": "file", "path": f"{tmp_path}/log/"}) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: creators[i % 4].create("00000000000000000001.json", b"%d" % i),
                                range(20)))
    assert results.count(True) == 1
    winner = results.index(True)
    assert (tmp_path / "log" / "00000000000000000001.json").read_bytes() == b"%d" % winner
