"""End-to-end training: determinism, learning regression, resume and the evaluate CLI.

Budgets (2-core machine): the learning-regression run is capped at 30k env
steps (it usually stops early, ~25k steps, once a confirmed evaluation
reaches 475); the determinism and resume runs use 3k env steps each.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from core.config import load_config

SMALL = ["total_env_steps=3000", "replay.min_size=500", "eval.every_env_steps=1500",
         "checkpoint.every_steps=200", "actors.broadcast_period=100", "learner.replay_ratio=0.5"]


def _train(tmp_path, name, overrides, executor="local", resume=False):
    from pipelines.train import train
    cfg = load_config(overrides=[f"executor={executor}", *overrides])
    run_dir = os.path.join(str(tmp_path), name)
    return train(cfg, run_dir, progress=False, resume=resume), run_dir


def _params(run_dir):
    from core.checkpoint import Checkpointer
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"))
    state, _ = ckpt.restore(select=["learner/params"])
    return state["learner"]["params"]


@pytest.fixture(scope="module")
def solved_run(tmp_path_factory):
    """The learning-regression run: default config, local executor, 30k env-step budget."""
    tmp = tmp_path_factory.mktemp("solved")
    return _train(tmp, "cartpole", ["total_env_steps=30000"])


@pytest.mark.slow
def test_learning_regression_cartpole_dqn_int8(solved_run):
    summary, run_dir = solved_run
    # Threshold: CartPole "solved" in the classic sense (195) within 30k env steps,
    # for the kept (best evaluated) policy, greedy, with int8 actors.
    assert summary["precision"] == "int8-dynamic"
    assert summary["best_eval_return"] >= 195, summary
    assert summary["final_eval"]["int8-dynamic"]["mean"] >= 195, summary
    assert summary["final_eval"]["fp32"]["mean"] >= 195, summary
    # int8 broadcasts are about 3.5x smaller than fp32 for this network.
    assert summary["bytes_per_broadcast"] < 100_000


@pytest.mark.slow   # uses the module's learning run (solved_run): a whole training run
def test_run_directory_is_complete_and_plain(solved_run):
    import zarr
    summary, run_dir = solved_run
    for name in ("config.json", "metrics.jsonl", "summary.json", "policy-int8-dynamic.tflite"):
        assert os.path.exists(os.path.join(run_dir, name)), name
    assert any(f.startswith("events") for f in os.listdir(os.path.join(run_dir, "tb")))
    kinds = {json.loads(l)["kind"] for l in open(os.path.join(run_dir, "metrics.jsonl"))}
    assert {"config", "broadcast", "commit", "learner", "eval", "summary"} <= kinds
    # Replay shards are plain zarr v3 groups readable without DataBloom.
    from core.replay import ReplayStore
    shards = ReplayStore.open(os.path.join(run_dir, "replay")).snapshot().shards
    assert shards and sum(s.rows for s in shards) >= 20_000
    # Checkpoints record the resolved config.
    from core.checkpoint import Checkpointer
    meta = Checkpointer(os.path.join(run_dir, "checkpoints")).metadata()
    assert json.loads(meta["config"])["env"]["id"] == "CartPole-v1"


@pytest.mark.slow
def test_local_executor_is_deterministic(tmp_path):
    a, dir_a = _train(tmp_path, "a", SMALL)
    b, dir_b = _train(tmp_path, "b", SMALL)
    assert a["env_steps"] == b["env_steps"] and a["learner_steps"] == b["learner_steps"]
    pa, pb = _params(dir_a), _params(dir_b)
    assert pa.keys() == pb.keys()
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)


@pytest.mark.slow
def test_resume_continues_from_latest_checkpoint(tmp_path):
    first, run_dir = _train(tmp_path, "r", SMALL)
    resumed, _ = _train(tmp_path, "r", [*SMALL, "total_env_steps=5000"], resume=True)
    assert resumed["env_steps"] > first["env_steps"]
    assert resumed["learner_steps"] > first["learner_steps"]
    assert resumed["replay_log_version"] > first["replay_log_version"]
    from core.replay import ReplayStore
    ids = [s.id for s in ReplayStore.open(os.path.join(run_dir, "replay")).snapshot().shards]
    assert len(ids) == len(set(ids))   # resumed shard ids never collide with committed ones


@pytest.mark.slow   # uses the module's learning run (solved_run)
def test_a_second_run_into_the_same_directory_is_refused(solved_run):
    from core.config import ConfigError
    summary, run_dir = solved_run
    before = open(os.path.join(run_dir, "config.json")).read()
    with pytest.raises(ConfigError, match="already holds a run; valid: --resume"):
        _train(os.path.dirname(run_dir), os.path.basename(run_dir), SMALL)
    assert open(os.path.join(run_dir, "config.json")).read() == before


@pytest.mark.slow
def test_evaluate_cli_and_export(solved_run, tmp_path):
    _, run_dir = solved_run
    out = tmp_path / "policy.tflite"
    proc = subprocess.run([sys.executable, "-m", "pipelines.evaluate", run_dir, "--episodes", "5",
                           "--export", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "mean return" in proc.stdout and out.stat().st_size > 10_000


@pytest.mark.slow
def test_evaluate_cli_rejects_a_non_run_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipelines.evaluate", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {str(tmp_path)!r} is not a run directory (no config.json)"]


# -- resume never hangs, never runs a committed task twice (issue 13, items 4 and 5) ----------------

KILL_AFTER = """
import os, signal, sys
from pipelines.run import driver
where, n = sys.argv[1], int(sys.argv[2])
seen = [0]
original = getattr(driver.Trainer, where)
def wrapped(self, *args, **kwargs):
    out = original(self, *args, **kwargs)
    seen[0] += 1
    if seen[0] == n:                      # kill -9 itself: no cleanup, no final checkpoint
        if os.environ.get("KILL_AFTER_CHECKPOINTS"):   # an exact kill point: the checkpoints asked so far are written
            self.stage.run("wait_checkpoints")
        os.kill(os.getpid(), signal.SIGKILL)
    return out
setattr(driver.Trainer, where, wrapped)
from pipelines.train import main
sys.exit(main(sys.argv[3:]))
"""
KILL_RUN = ["--executor", "local", "--no-progress", "--set", "total_env_steps=4096",
            "--set", "eval.every_env_steps=2048", "--set", "eval.episodes=5", "--set", "eval.confirm_episodes=0",
            "--set", "learner.replay_ratio=0.5"]


def _replay_is_each_task_once(run_dir):
    """Every task in one live shard, (episode, step) rows unique and gap-free; returns total rows."""
    import zarr
    from core.replay import ReplayStore
    store = ReplayStore.open(os.path.join(run_dir, "replay"))
    state = store.state()
    added = [sh["id"] for v in range(1, state.version + 1) for sh in store.log.entry(v).get("shards", [])]
    assert len(added) == len(set(added)) == len(state.live), f"a shard was committed twice: {added}"
    tasks, episodes, steps = [], [], []
    for sid in state.live:
        group = zarr.open_group(os.path.join(run_dir, "replay", "shards", sid), mode="r")
        tasks += group.attrs["databloom"]["attrs"]["tasks"]
        episodes.append(group["episode_id"][:])
        steps.append(group["step"][:])
    assert len(tasks) == len(set(tasks)), f"a task was committed twice: {sorted(tasks)}"
    episodes, steps = np.concatenate(episodes), np.concatenate(steps)
    pairs = episodes.astype(np.int64) * 100_000 + steps
    assert len(np.unique(pairs)) == len(pairs), "an episode id was reused"
    for e in np.unique(episodes):
        s = np.sort(steps[episodes == e])
        assert (s == np.arange(len(s))).all(), f"episode {e} has steps {s[:10]}..."
    return state.rows


@pytest.mark.timeout(400)
# Kills after a commit that follows the checkpoint (one block, two blocks) are the cases of
# test_resume_identity.py::test_a_run_killed_at_any_point_after_a_checkpoint_resumes_bit_identical, which
# asserts the whole replay (so every task once) and the parameters equal the uninterrupted run's.
@pytest.mark.slow
@pytest.mark.parametrize("where, n, every", [
    ("_submit_write", 4, 200),   # block 3's shard written, not committed
])
def test_resume_after_kill_9_commits_every_task_once(tmp_path, where, n, every):
    run_dir = str(tmp_path / "run")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    settings = [*KILL_RUN, "--set", f"checkpoint.every_steps={every}"]
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER, where, str(n), "--run-dir", run_dir, *settings],
                            capture_output=True, text=True, env=env, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = subprocess.run([sys.executable, "-m", "pipelines.train", "--resume", run_dir, *settings],
                             capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert _replay_is_each_task_once(run_dir) == summary["env_steps"] == 4096
    assert summary["learner_steps"] == 2048


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume_with_a_cache_smaller_than_the_checkpoint_trains_on(tmp_path):
    """Issue 13 item 4: replay.capacity below the rows the checkpoint saw used to hang forever."""
    small = ["replay.capacity=1024", "learner.replay_ratio=0.5"]
    first, run_dir = _train(tmp_path, "small", [*small, "total_env_steps=2048"])
    resumed, _ = _train(tmp_path, "small", [*small, "total_env_steps=2560"], resume=True)
    assert (first["env_steps"], resumed["env_steps"]) == (2048, 3072)
    assert resumed["learner_steps"] == 1536


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stall_is_a_one_line_error_naming_what_it_waits_for(tmp_path, monkeypatch):
    import concurrent.futures
    from pipelines.run.flight import StallError
    from pipelines.executors.local import LocalExecutor
    real_submit = LocalExecutor.submit

    def submit(self, fn, *args, key=None, **kwargs):
        if (key or "").startswith("write-"):
            return concurrent.futures.Future()          # a write that never finishes
        return real_submit(self, fn, *args, key=key, **kwargs)
    monkeypatch.setattr(LocalExecutor, "submit", submit)
    with pytest.raises(StallError, match=r"no progress for 1 s; waiting for shard write s00000000 \(learner block 0"):
        _train(tmp_path, "stall", ["total_env_steps=2048", "actors.stall_timeout_s=1"])
