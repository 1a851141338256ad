"""Same config + seed => the same run on every executor (pipelines/run/plan.py).

The default config for 4,096 env steps (4 blocks of 1,024 rows, 2,048
learner steps, a checkpoint, two evaluations) runs on ``local``, on
``dask`` with one and with two workers (an embedded LocalCluster), with one
actor worker and the learner placed on a worker of its own
(``learner.resources``), and on a real ``dask scheduler`` with two
``dask worker`` processes (work stealing on), also with one of those workers SIGKILLed mid-run.
The learner's checkpointed parameters must be bit-identical, and so must the
committed replay: the same shard ids in the same log order, every stored
array of every shard (the episode-segment index included) equal. About 2
minutes.
"""
import json
import os

import numpy as np
import pytest

from core.config import load_config

#: 4 blocks of 1,024 rows, 512 learner steps each: these tests check the plan's mechanics at the replay ratio they
#: were laid out with (0.5), not the default's (0.25, chosen for learning speed).
SETTINGS = ["total_env_steps=4096", "eval.every_env_steps=2048", "eval.episodes=10", "eval.confirm_episodes=0",
            "checkpoint.every_steps=1000", "learner.replay_ratio=0.5"]


def _run(tmp_path, name, executor, overrides=()):
    from pipelines.train import train
    cfg = load_config(overrides=[f"executor={executor}", *SETTINGS, *overrides])
    run_dir = os.path.join(str(tmp_path), name)
    return train(cfg, run_dir, progress=False), run_dir


def _params(run_dir):
    from core.checkpoint import Checkpointer
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"))
    state, _ = ckpt.restore(select=["learner/params"])
    ckpt.close()
    return state["learner"]["params"]


def _arrays(group, prefix=""):
    out = {}
    for name, member in group.members():
        if hasattr(member, "members"):
            out.update(_arrays(member, f"{prefix}{name}/"))
        else:
            out[prefix + name] = member[...]
    return out


def _replay(run_dir):
    """``[(shard id, {array path: values})]`` in commit-log order (live shards)."""
    import zarr
    from core.replay import ReplayStore
    state = ReplayStore.open(os.path.join(run_dir, "replay")).state()
    return [(sid, _arrays(zarr.open_group(os.path.join(run_dir, "replay", "shards", sid), mode="r")))
            for sid in state.live]


def _assert_same_run(a, b, label):
    (sa, da), (sb, db) = a, b
    for key in ("env_steps", "learner_steps", "episodes", "policy_versions", "best_version", "best_eval_return"):
        assert sa[key] == sb[key], f"{label}: {key} {sa[key]} != {sb[key]}"
    pa, pb = _params(da), _params(db)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert np.array_equal(pa[k], pb[k]), f"{label}: parameter {k} differs"
    ra, rb = _replay(da), _replay(db)
    assert [s for s, _ in ra] == [s for s, _ in rb], f"{label}: committed shard ids differ"
    for (sid, xa), (_, xb) in zip(ra, rb):
        assert xa.keys() == xb.keys(), f"{label}: {sid} arrays differ"
        for name in xa:
            assert np.array_equal(xa[name], xb[name]), f"{label}: {sid}/{name} differs"


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("det"), "local", "local")


#: The learner on a worker of its own: an embedded cluster starts one more worker advertising the resource.
PLACED = 'learner.resources={"GPU": 1}'


@pytest.mark.slow
@pytest.mark.parametrize("workers, learner", [(1, None), (2, None), (1, PLACED)],
                         ids=["1-worker", "2-workers", "1-worker+learner-worker"])
def test_dask_run_is_bit_identical_to_the_local_run(local_run, tmp_path, workers, learner):
    run = _run(tmp_path, f"dask{workers}", "dask", [f"dask.n_workers={workers}", *([learner] if learner else [])])
    assert run[0]["learner_steps"] == 2048 and len(_replay(run[1])) == 4
    _assert_same_run(local_run, run, f"local vs dask-{workers}" + (" with the learner on a worker" if learner else ""))
    # Data flows one way: the driver receives metadata only (well under 1% of the trajectory bytes).
    summary, traj = run[0], run[0]["trajectory_bytes_per_env_step"]
    with open(os.path.join(run[1], "metrics.jsonl")) as f:
        records = [json.loads(l) for l in f]
    placement = [r for r in records if r["kind"] == "placement"]
    (received,) = [r["driver_bytes_in"] for r in records if r["kind"] == "schedule"]
    assert 0 < received["tasks"] / summary["env_steps"] < 0.01 * traj
    if learner:     # + the stage's metrics records (loss, broadcast quality) and version metadata
        assert 0 < received["learner_stage"] and summary["driver_bytes_in_per_env_step"] < 0.03 * traj
    else:
        assert received["learner_stage"] == 0
        assert 0 < summary["driver_bytes_in_per_env_step"] < 0.01 * traj
    assert len(placement) == 1 and len(placement[0]["actors"]) == 4 and "pid" in placement[0]["learner"]
    if learner:     # a worker holds the learner and runs no actor
        where = placement[0]["learner_address"]
        assert where.startswith("tcp://") and placement[0]["learner"].startswith(where)
        assert where not in placement[0]["actors"].values()
    else:
        assert placement[0]["learner_address"] is None and "(driver process)" in placement[0]["learner"]


@pytest.mark.slow
def test_policy_lag_is_part_of_the_plan(local_run, tmp_path):
    """A different lag is a different (but again reproducible) plan: the tasks' policy versions move."""
    run = _run(tmp_path, "lag0", "local", ["actors.policy_lag=0"])
    versions = lambda r: [int(x["policy_version"].max()) for _, x in _replay(r[1])]
    assert versions(local_run) == [1, 1, 2, 3]        # block b acts with the version after block b - 2
    assert versions(run) == [1, 2, 3, 4]              # lag 0: the version after block b - 1


@pytest.mark.slow
def test_a_run_on_a_real_dask_cluster_is_bit_identical_to_the_local_run(local_run, tmp_path):
    """``dask scheduler`` + 2 ``dask worker`` processes, work stealing on (the scheduler's default):
    a stolen or moved rollout continues its actor from the state its predecessor's result carries."""
    import subprocess
    import sys
    from test_dask_cluster import REPO, THREAD_ENV, Cluster
    cluster = Cluster(tmp_path)
    run_dir = str(tmp_path / "cluster")
    try:
        out = subprocess.run([sys.executable, "-m", "pipelines.train", "--executor", "dask", "--dask-address",
                              cluster.address, "--run-dir", run_dir, "--no-progress",
                              *[a for s in SETTINGS for a in ("--set", s)]],
                             cwd=REPO, capture_output=True, text=True, env={**os.environ, **THREAD_ENV}, timeout=400)
    finally:
        cluster.close()
    assert out.returncode == 0, out.stderr[-3000:]
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    _assert_same_run(local_run, (summary, run_dir), "local vs dask cluster")


#: Bit 21 of an episode's stream id (``core.rollout``): set on episodes of an actor rebuilt from seeds after
#: its state was lost. ``episode_id = (stream_id << 32) | counter`` (``core.trajectory.make_episode_id``).
INCARNATION_BIT = 21 + 32


def _rebuilt_episodes(run_dir):
    """Committed episode ids that carry the incarnation bit (their actor was rebuilt after a loss)."""
    ids = np.concatenate([x["episode_id"] for _, x in _replay(run_dir)])
    return np.unique(ids[(ids >> INCARNATION_BIT) & 1 == 1])


@pytest.mark.slow
def test_a_real_cluster_that_loses_a_worker_is_identical_or_the_documented_exception(local_run, tmp_path):
    """``dask scheduler`` + 2 ``dask worker``s, one SIGKILLed after the first commit, run to the end.

    Dask recomputes the lost results from their dependency chain, so the run must be bit-identical
    to the local run; unless an actor's state was gone and the actor was rebuilt (``core.rollout``:
    its new episodes carry the incarnation bit), which is the documented exception: the replay is
    then complete and consistent (every committed shard once, no duplicate ``(episode, step)`` row,
    each episode's steps 0..n-1, rows == env steps) but not identical.
    """
    import signal
    import subprocess
    import sys
    import time
    from test_dask_cluster import REPO, THREAD_ENV, Cluster, _check_replay, _metrics
    cluster = Cluster(tmp_path)
    run_dir = str(tmp_path / "cluster")
    # A stall (seen once in ~20 runs, not reproduced) ends the run with the driver's one-line StallError
    # naming what it waited for, well before this test's timeout.
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.train", "--executor", "dask", "--dask-address",
                             cluster.address, "--run-dir", run_dir, "--no-progress",
                             *[a for s in SETTINGS for a in ("--set", s)], "--set", "actors.stall_timeout_s=90"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **THREAD_ENV})
    try:
        deadline = time.time() + 120
        while not _metrics(run_dir, "commit") and time.time() < deadline:     # actors are stepping
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        assert _metrics(run_dir, "commit"), "the run never committed a shard"
        os.kill(cluster.worker_pids[sorted(cluster.worker_pids)[0]], signal.SIGKILL)
        killed_at = _metrics(run_dir, "commit")[-1]["step"]
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cluster.close()
    assert proc.returncode == 0, stderr[-3000:]
    assert killed_at < 4096, "the worker died after the last commit: not a fault test"
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    rebuilt = _rebuilt_episodes(run_dir)
    print(f"\nworker lost after {killed_at} env steps: "
          + (f"{len(rebuilt)} committed episodes of rebuilt actors (documented exception)" if len(rebuilt)
             else "no actor rebuilt (bit-identical branch)"))
    if len(rebuilt) == 0:
        _assert_same_run(local_run, (summary, run_dir), "local vs dask cluster that lost a worker")
    else:   # complete and consistent: the plan's shards, each once and whole, every row counted
        state = _check_replay(run_dir)
        assert state.rows == summary["env_steps"]
        local, _ = local_run
        if summary["time_to_target_s"] is None:     # other episodes may solve earlier (a planned stop)
            assert (summary["env_steps"], summary["learner_steps"]) == (local["env_steps"], local["learner_steps"])
            assert [s for s, _ in _replay(run_dir)] == [s for s, _ in _replay(local_run[1])]
