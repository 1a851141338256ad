"""Dask cluster runs: a real ``dask scheduler`` and two ``dask worker`` processes on localhost.

``python -m pipelines.train --dask-address tcp://127.0.0.1:PORT`` joins the
cluster exactly as it would join a remote one (README: "Running on a Dask
cluster"). The fault test SIGKILLs one worker while rollouts are in flight:
training must finish, the replay log must hold every committed shard once,
completely, with consistent episodes, and the final policy must still reach
``THRESHOLD`` within ``BUDGET`` env steps (the same bar as
tests/test_executors.py). About 1.5 minutes for the file.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = 8_192
THRESHOLD = 100.0
TRAIN_SETTINGS = ["--set", f"total_env_steps={BUDGET}", "--set", "actors.num_actors=2",
                  "--set", "actors.steps_per_task=128", "--set", "eval.every_env_steps=2048",
                  "--set", "eval.episodes=10", "--set", "eval.confirm_episodes=0", "--seed", "0"]
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "TF_CPP_MIN_LOG_LEVEL": "2"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dask_cli() -> list:
    return [sys.executable, "-m", "distributed.cli.dask_scheduler"], [sys.executable, "-m", "distributed.cli.dask_worker"]


class Cluster:
    """A scheduler and workers as separate OS processes (what ``dask scheduler`` / ``dask worker`` start).

    Workers run with ``--no-nanny``: a SIGKILLed worker stays dead (a nanny would restart it).
    """

    def __init__(self, tmp_path, n_workers: int = 2):
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        env = {**os.environ, **THREAD_ENV}
        scheduler_cmd, worker_cmd = _dask_cli()
        self.logs = []
        self.scheduler = self._start(scheduler_cmd + ["--host", "127.0.0.1", "--port", str(self.port),
                                                      "--dashboard-address", ":0"], tmp_path / "scheduler.log", env)
        self.workers = [self._start(worker_cmd + [self.address, "--nthreads", "1", "--no-nanny",
                                                  "--name", f"w{i}", "--dashboard-address", ":0",
                                                  "--local-directory", str(tmp_path / f"w{i}")],
                                    tmp_path / f"worker{i}.log", env)
                        for i in range(n_workers)]
        from distributed import Client
        with Client(self.address, timeout="30s") as client:
            client.wait_for_workers(n_workers, timeout=60)
            self.worker_pids = client.run(os.getpid)           # worker address -> pid

    def _start(self, cmd, log_path, env):
        log = open(log_path, "w")
        self.logs.append(log)
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def close(self) -> None:
        for proc in self.workers:        # graceful worker shutdown takes ~15 s; nothing to keep
            if proc.poll() is None:
                proc.kill()
        if self.scheduler.poll() is None:
            self.scheduler.terminate()
        for proc in self.workers + [self.scheduler]:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def _train_cmd(cluster, run_dir):
    return [sys.executable, "-m", "pipelines.train", "--executor", "dask", "--dask-address", cluster.address,
            "--run-dir", str(run_dir), "--no-progress", *TRAIN_SETTINGS]


def _metrics(run_dir, kind):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in (json.loads(line) for line in f if line.strip()) if r["kind"] == kind]


def _check_replay(run_dir):
    """Every committed shard once, complete, readable with plain zarr; episodes consistent."""
    import zarr
    from core.replay import ReplayStore
    store = ReplayStore.open(os.path.join(run_dir, "replay"))
    state = store.state()
    added = [s["id"] for v in range(1, state.version + 1) for s in store.log.entry(v).get("shards", [])]
    assert len(added) == len(set(added)) == len(state.live), "a shard was committed twice"
    episodes, steps = [], []
    for shard_id, info in state.live.items():
        group = zarr.open_group(os.path.join(run_dir, "replay", "shards", shard_id), mode="r")
        assert group["reward"].shape[0] == info.rows, f"partial shard {shard_id}"
        episodes.append(group["episode_id"][:])
        steps.append(group["step"][:])
    episodes, steps = np.concatenate(episodes), np.concatenate(steps)
    pairs = episodes.astype(np.int64) * 100_000 + steps
    assert len(np.unique(pairs)) == len(pairs), "duplicate (episode, step) rows"
    for e in np.unique(episodes):   # each episode: steps 0..n-1, no gaps, no repeats
        s = np.sort(steps[episodes == e])
        assert (s == np.arange(len(s))).all(), f"episode {e} has inconsistent steps {s[:10]}..."
    return state


def _learned(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    return summary, max(summary["best_eval_return"], summary["final_eval"]["fp32"]["mean"])


def test_train_joins_a_running_cluster(cluster, tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run(_train_cmd(cluster, run_dir), cwd=REPO, capture_output=True, text=True, timeout=400,
                         env={**os.environ, **THREAD_ENV})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final return (fp32)" in out.stdout
    state = _check_replay(str(run_dir))
    summary, learned = _learned(str(run_dir))
    assert state.rows == summary["env_steps"] >= BUDGET
    assert learned >= THRESHOLD
    workers = _metrics(str(run_dir), "workers")[-1]["workers"]
    assert set(workers) == set(cluster.worker_pids)            # both cluster workers ran actors
    assert all(w["tasks"] > 0 and w["env_steps_per_s"] > 0 for w in workers.values())


def test_sigkill_a_worker_while_rollouts_are_in_flight(cluster, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_train_cmd(cluster, run_dir), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **THREAD_ENV})
    try:
        deadline = time.time() + 120
        while not _metrics(str(run_dir), "commit") and time.time() < deadline:   # actors are stepping
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        assert _metrics(str(run_dir), "commit"), "training never committed a shard"
        victim_addr = sorted(cluster.worker_pids)[0]
        os.kill(cluster.worker_pids[victim_addr], signal.SIGKILL)
        killed_at = _metrics(str(run_dir), "commit")[-1]["step"]
        stdout, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    assert killed_at < BUDGET, "the worker died after training had finished: not a fault test"
    state = _check_replay(str(run_dir))
    summary, learned = _learned(str(run_dir))
    assert state.rows == summary["env_steps"] >= BUDGET
    assert learned >= THRESHOLD, f"{learned:.1f} after losing a worker"
    workers = _metrics(str(run_dir), "workers")[-1]["workers"]
    survivor = [w for w in workers if w != victim_addr]
    assert len(survivor) == 1 and workers[survivor[0]]["retries"] >= 1   # the dead worker's actor moved
