"""Dask cluster runs: a real ``dask scheduler`` and two ``dask worker`` processes on localhost.

``python -m pipelines.train --dask-address tcp://127.0.0.1:PORT`` joins the
cluster exactly as it would join a remote one (README: "Running on a Dask
cluster"). The fault test SIGKILLs one worker while rollouts are in flight:
training must finish, the replay log must hold every committed shard once,
completely, with consistent episodes, and the final policy must still reach
``THRESHOLD`` within ``BUDGET`` env steps (the same bar as
tests/pipelines/test_executors.py). With ``--set learner.resources='{"GPU": 1}'`` and one
worker started with ``--resources GPU=1``, the learner runs as a Dask actor on
that worker and the other runs the actors; if that worker dies the run stops
with one line naming ``--resume``, and resuming finishes it. About 3 minutes
for the file.
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

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
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

    def __init__(self, tmp_path, n_workers: int = 2, worker_args=None):
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        env = {**os.environ, **THREAD_ENV}
        scheduler_cmd, worker_cmd = _dask_cli()
        self.logs = []
        self.scheduler = self._start(scheduler_cmd + ["--host", "127.0.0.1", "--port", str(self.port),
                                                      "--dashboard-address", ":0"], tmp_path / "scheduler.log", env)
        worker_args = worker_args or {}     # worker index -> extra `dask worker` arguments
        self.workers = [self._start(worker_cmd + [self.address, "--nthreads", "1", "--no-nanny",
                                                  "--name", f"w{i}", "--dashboard-address", ":0",
                                                  "--local-directory", str(tmp_path / f"w{i}"),
                                                  *worker_args.get(i, [])],
                                    tmp_path / f"worker{i}.log", env)
                        for i in range(n_workers)]
        from distributed import Client
        with Client(self.address, timeout="30s") as client:
            client.wait_for_workers(n_workers, timeout=60)
            self.worker_pids = client.run(os.getpid)           # worker address -> pid
            self.worker_names = {a: w["name"] for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}

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


def _train_cmd(cluster, run_dir, *extra):
    return [sys.executable, "-m", "pipelines.train", "--executor", "dask", "--dask-address", cluster.address,
            "--run-dir", str(run_dir), "--no-progress", *TRAIN_SETTINGS, *extra]


GPU_LEARNER = ["--set", 'learner.resources={"GPU": 1}']


@pytest.fixture
def gpu_cluster(tmp_path):
    """Worker w1 advertises GPU=1 (no GPU needed: Dask resources are labels the worker declares)."""
    c = Cluster(tmp_path, worker_args={1: ["--resources", "GPU=1"]})
    yield c
    c.close()


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_learner_runs_on_the_worker_with_the_requested_resource(gpu_cluster, tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run(_train_cmd(gpu_cluster, run_dir, *GPU_LEARNER), cwd=REPO, capture_output=True,
                         text=True, timeout=400, env={**os.environ, **THREAD_ENV})
    assert out.returncode == 0, out.stderr[-3000:]
    gpu = next(a for a, name in gpu_cluster.worker_names.items() if name == "w1")
    (placement,) = _metrics(str(run_dir), "placement")
    assert placement["learner_address"] == gpu and placement["learner"].startswith(gpu)
    assert placement["learner_resources"] == {"GPU": 1.0}
    assert set(placement["actors"].values()) == set(gpu_cluster.worker_pids) - {gpu}   # actors avoid it
    state = _check_replay(str(run_dir))
    summary, learned = _learned(str(run_dir))
    assert state.rows == summary["env_steps"] >= BUDGET and summary["learner_steps"] > 0
    assert learned >= THRESHOLD
    # Task results stay under 1% of the trajectory bytes; the placed learner's metric records (losses, broadcast
    # quality, version metadata; their count follows the background quality probe) cross too (as in
    # tests/pipelines/test_determinism.py's placed case).
    traj = summary["trajectory_bytes_per_env_step"]
    received = _metrics(str(run_dir), "schedule")[-1]["driver_bytes_in"]
    assert 0 < received["tasks"] / summary["env_steps"] < 0.01 * traj
    assert 0 < received["learner_stage"] and summary["driver_bytes_in_per_env_step"] < 0.03 * traj
    # The worker that imported TensorFlow for the learner, and the one whose actors ran LiteRT, logged none of
    # their start-up notices (core.native_logs): a `dask worker` is a process the user watches too.
    from core.native_logs import notices_in
    for i in (0, 1):
        log = (tmp_path / f"worker{i}.log").read_text()
        assert not notices_in(log), log[-3000:]


def _complete_checkpoint(run_dir):
    from core.checkpoint import Checkpointer
    if not (run_dir / "checkpoints" / "zarr.json").exists():
        return None
    ckpt = Checkpointer(str(run_dir / "checkpoints"))
    try:
        return ckpt.latest_step()
    finally:
        ckpt.close()


@pytest.mark.slow
def test_losing_the_learners_worker_is_one_line_and_resume_finishes_the_run(gpu_cluster, tmp_path):
    """The learner's state dies with its worker: the run stops (exit 2, one line naming --resume), and
    ``--resume`` continues from the last checkpoint (here with the learner in the driver: no GPU worker left)."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_train_cmd(gpu_cluster, run_dir, *GPU_LEARNER, "--set", "checkpoint.every_steps=1000"),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **THREAD_ENV})
    try:
        deadline = time.time() + 120
        while _complete_checkpoint(run_dir) is None and time.time() < deadline:   # the first (1,024 steps)
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        gpu = next(a for a, name in gpu_cluster.worker_names.items() if name == "w1")
        os.kill(gpu_cluster.worker_pids[gpu], signal.SIGKILL)
        killed_at = _metrics(str(run_dir), "commit")[-1]["step"]
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed_at < BUDGET, "the worker died after training had finished: not a fault test"
    assert proc.returncode == 2, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: the learner's worker {gpu} was lost") and f"--resume {run_dir}" in last, last
    resumed = subprocess.run([sys.executable, "-m", "pipelines.train", "--resume", str(run_dir), "--no-progress",
                              "--dask-address", gpu_cluster.address, "--set", "learner.resources={}"],
                             cwd=REPO, capture_output=True, text=True, timeout=400, env={**os.environ, **THREAD_ENV})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    state = _check_replay(str(run_dir))
    summary, learned = _learned(str(run_dir))
    assert state.rows == summary["env_steps"] >= BUDGET
    assert learned >= THRESHOLD


@pytest.mark.slow
def test_resources_no_worker_advertises_are_refused_before_anything_is_written(cluster, tmp_path, monkeypatch):
    from core.config import ConfigError, from_dict
    from pipelines.executors import dask_stage
    from pipelines.train import train
    monkeypatch.setattr(dask_stage, "RESOURCE_WAIT_S", 1.0)
    cfg = from_dict({"dask": {"address": cluster.address}, "learner": {"resources": {"GPU": 1}}})
    with pytest.raises(ConfigError, match=r'^learner.resources \{"GPU": 1.0\}: no worker of the cluster advertises '
                                          r'them \(workers: tcp://.*valid: start one with dask worker --resources '
                                          r'"GPU=1", or learner.resources \{\}$'):
        train(cfg, str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run" / "config.json").exists() and not (tmp_path / "run" / "replay").exists()
