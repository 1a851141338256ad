"""Executors must agree: the same small CartPole job on local, dask and beam.

Each executor trains CartPole-v1 for ``BUDGET`` env steps and must leave a
complete run directory (replay readable with plain zarr, a commit log past
version 0, a restorable checkpoint, eval records in metrics.jsonl, the same
summary keys) and must learn: the better of the best in-training evaluation
and the final fp32 evaluation reaches ``THRESHOLD``.

Budget and threshold (measured on the 2-core CI machine, seed 0): all three
executors reach 100+ within 8,192 env steps; a random policy scores ~22.
Whole file: ~3-4 minutes (beam pays ~5-10 s of DirectRunner start-up per
round pipeline: one round for the smoke test, one per launch in the resume test).
"""
import json
import os

import pytest

from core import config as config_lib

BUDGET = 8_192
THRESHOLD = 100.0
SUMMARY_KEYS = {"run_dir", "env_id", "executor", "precision", "seed", "env_steps", "learner_steps", "episodes",
                "driver_bytes_in_per_env_step", "trajectory_bytes_per_env_step",
                "wall_s", "env_steps_per_s", "policy_versions", "bytes_per_broadcast", "best_eval_return",
                "best_version", "time_to_target_s", "env_steps_to_target", "mean_policy_lag_versions",
                "mean_policy_lag_s", "final_eval", "replay_log_version",
                "energy_kwh", "co2e_kg", "energy_source", "carbon_backend", "carbon_pue", "energy_process_time_kwh",
                "wall_split", "clock"}


def small_config(executor: str, total_env_steps: int = BUDGET, **extra):
    # A plan block is num_actors x num_envs x steps_per_task = 2048 env steps; a Beam round runs up to
    # --blocks_per_round (16) blocks, and actors keep their envs across blocks and rounds (pipelines.beam.rounds).
    data = {"executor": executor, "total_env_steps": total_env_steps, "seed": 0,
            "env": {"num_envs": 8},
            "actors": {"num_actors": 2, "steps_per_task": 128},
            "learner": {"replay_ratio": 0.5},
            "eval": {"every_env_steps": 2048, "episodes": 10, "confirm_episodes": 0},
            "checkpoint": {"every_steps": 1000}}
    for key, value in extra.items():
        data.setdefault(key, {}).update(value)
    return config_lib.from_dict(data)


def train(cfg, run_dir, resume=False, pipeline_args=None):
    from pipelines.train import train as train_entry
    # beam: 2 DirectRunner worker processes (one per core on CI machines)
    return train_entry(cfg, str(run_dir), progress=False, resume=resume, pipeline_args=pipeline_args)


def assert_complete_run_dir(run_dir, summary):
    import zarr
    from core.checkpoint import Checkpointer
    from core.replay import ReplayStore
    assert set(summary) == SUMMARY_KEYS
    store = ReplayStore.open(os.path.join(run_dir, "replay"))
    state = store.state()
    assert store.latest_version() > 0 and summary["replay_log_version"] == store.latest_version()
    assert state.rows == summary["env_steps"] >= summary["env_steps"] > 0
    rows = 0
    for shard_id in state.live:   # plain zarr, no DataBloom code
        group = zarr.open_group(os.path.join(run_dir, "replay", "shards", shard_id), mode="r")
        rows += group["reward"].shape[0]
        assert group["observation"].shape[0] == group["reward"].shape[0]
    assert rows == state.rows
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"))
    restored, _ = ckpt.restore(ckpt.latest_step())
    assert int(restored["learner"]["counters"]["learner_steps"]) == summary["learner_steps"] > 0
    ckpt.close()
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        kinds = [json.loads(line)["kind"] for line in f]
    assert "eval" in kinds and "commit" in kinds and kinds[-1] == "summary"
    assert os.path.isfile(os.path.join(run_dir, "summary.json"))


# Beam's learning run is tests/pipelines/test_beam.py::test_beam_launcher_never_imports_tensorflow_and_the_run_still_learns
# (the same small config, run as the launcher a user starts, with this test's checks); a Beam run resumed with
# a larger budget is tests/pipelines/test_beam_identity.py::test_a_beam_run_resumed_with_a_larger_budget_is_bit_identical.
@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "dask"])
def test_executor_learns_cartpole_and_leaves_a_complete_run_dir(executor, tmp_path):
    run_dir = tmp_path / executor
    summary = train(small_config(executor), run_dir)
    assert summary["executor"] == executor and summary["env_steps"] >= BUDGET
    assert_complete_run_dir(str(run_dir), summary)
    # Data flows one way: the driver (Beam: the launcher) receives metadata, well under 1% of trajectories.
    assert 0 < summary["driver_bytes_in_per_env_step"] < 0.01 * summary["trajectory_bytes_per_env_step"]
    learned = max(summary["best_eval_return"], summary["final_eval"]["fp32"]["mean"])
    assert learned >= THRESHOLD, (f"{executor}: {learned:.1f} < {THRESHOLD} within {BUDGET} env steps"
                                  f" ({summary['learner_steps']} learner steps, {summary['policy_versions']}"
                                  f" policy versions, {summary['wall_s']:.0f} s)")


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "dask"])
def test_resume_continues_from_the_latest_checkpoint(executor, tmp_path):
    run_dir = tmp_path / executor
    first = train(small_config(executor, total_env_steps=2048), run_dir)
    second = train(small_config(executor, total_env_steps=4096), run_dir, resume=True)
    assert second["env_steps"] >= 4096 > first["env_steps"] >= 2048
    assert second["learner_steps"] > first["learner_steps"]
    assert second["replay_log_version"] > first["replay_log_version"]
    assert_complete_run_dir(str(run_dir), second)


def _lose_first_tasks(monkeypatch, kinds):
    """Make the local executor hand back a cancelled future (what Dask gives for a task whose inputs were
    lost with a worker) for the first task of each kind in ``kinds`` (key prefixes); returns their keys."""
    import concurrent.futures
    from pipelines.executors.local import LocalExecutor
    real_submit, lost = LocalExecutor.submit, []

    def submit(self, fn, *args, key=None, **kwargs):
        kind = (key or "").split("-", 1)[0]
        if kind in kinds and not any(k.startswith(kind + "-") for k in lost):   # the first of each is lost
            lost.append(key)
            fut = concurrent.futures.Future()
            fut.cancel()
            return fut
        return real_submit(self, fn, *args, key=key, **kwargs)
    monkeypatch.setattr(LocalExecutor, "submit", submit)
    return lost


@pytest.mark.slow
def test_tasks_lost_with_a_worker_are_submitted_again(tmp_path, monkeypatch):
    """A future Dask cancels ("already forgotten", after its worker was killed) is not fatal: a lost
    rollout makes its actor run a fresh task, a lost shard write is submitted again with the same id."""
    lost = _lose_first_tasks(monkeypatch, ("rollout", "write"))
    run_dir = tmp_path / "run"
    summary = train(small_config("local", total_env_steps=2048), run_dir)
    assert [k.split("-", 1)[0] for k in lost] == ["rollout", "write"]
    assert summary["env_steps"] >= 2048
    assert_complete_run_dir(str(run_dir), summary)                 # every step committed once
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        tasks = [json.loads(line)["task"] for line in f if json.loads(line)["kind"] == "task_lost"]
    assert tasks[0].startswith("rollout actor") and tasks[1] == "write s00000000"


@pytest.mark.slow
def test_an_evaluation_lost_with_a_worker_is_submitted_again_with_the_same_seeds(tmp_path, monkeypatch):
    """A cancelled evaluation (its inputs lost with a worker) runs again as the same evaluation: same
    version, same seeds, first in line, so the run logs what an undisturbed run logs."""
    cfg = lambda: small_config("local", total_env_steps=4096, eval={"every_env_steps": 1024})  # noqa: E731
    clean = train(cfg(), tmp_path / "clean")
    lost = _lose_first_tasks(monkeypatch, ("eval",))                 # the first evaluation is lost
    run_dir = tmp_path / "run"
    summary = train(cfg(), run_dir)
    assert len(lost) == 1 and lost[0].endswith("-1")
    records = lambda d: [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]  # noqa: E731
    evals = lambda d: [(r["step"], r["version"], r["mean"]) for r in records(d) if r["kind"] == "eval"]  # noqa: E731
    assert evals(run_dir) == evals(tmp_path / "clean") and len(evals(run_dir)) == 2
    assert [r["task"] for r in records(run_dir) if r["kind"] == "task_lost"] == ["evaluation 1 of version 2"]
    for key in ("env_steps", "learner_steps", "best_version", "best_eval_return"):
        assert summary[key] == clean[key]


@pytest.mark.slow
def test_dask_workers_can_write_the_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    summary = train(small_config("dask", total_env_steps=2048, checkpoint={"engine": "dask", "every_steps": 200}),
                    run_dir)
    assert_complete_run_dir(str(run_dir), summary)                 # the latest checkpoint restores
    with pytest.raises(config_lib.ConfigError, match="checkpoint.engine 'dask' needs executor 'dask'"):
        config_lib.validate(small_config("local", checkpoint={"engine": "dask"}))


@pytest.mark.slow
def test_dask_wait_counts_a_cancelled_future_as_done():
    """distributed.wait raises FuturesCancelledError for a cancelled input ("lost dependencies" after a
    worker was killed); the executor's wait must hand it back as done so the driver resubmits the work."""
    import time
    from pipelines.executors.dask import DaskExecutor
    executor = DaskExecutor(n_workers=1)
    try:
        slow = executor.submit(time.sleep, 30, key="slow")
        cancelled = executor.submit(time.sleep, 30, key="cancelled")
        cancelled.cancel()
        done = executor.wait([slow, cancelled], timeout=5)
        assert done == [cancelled] and cancelled.cancelled() and not slow.done()
    finally:
        executor.close()


def _worker_facts():
    import signal
    import sys
    return {"ppid": os.getppid(), "preloaded": "gymnasium" in sys.modules,
            "ignores": [signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM)],
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS")}


@pytest.mark.slow
def test_embedded_workers_fork_from_a_forkserver_that_imported_their_modules():
    """The embedded cluster's workers are forks of multiprocessing's forkserver (started before the driver
    imports distributed, so the two imports overlap), which imported WORKER_PRELOAD once: a worker has
    gymnasium before any task imports it, ignores Ctrl-C and SIGTERM (the driver's planned stop) and has the
    thread counts it was given."""
    from multiprocessing import forkserver
    from pipelines.executors.dask import DaskExecutor
    executor = DaskExecutor(n_workers=1, thread_env={"OPENBLAS_NUM_THREADS": "1"})
    try:
        facts = executor.submit(_worker_facts).result()
    finally:
        executor.close()
    assert facts["ppid"] == forkserver._forkserver._forkserver_pid != os.getpid()
    assert facts["preloaded"] and facts["ignores"] == [True, True] and facts["blas_threads"] == "1"


@pytest.mark.parametrize("data, match", [
    ({"executor": "local"}, r"^learner.resources \{\"GPU\": 1.0\} needs executor 'dask', not 'local' "),
    ({"executor": "beam"}, r"^learner.resources \{\"GPU\": 1.0\} needs executor 'dask', not 'beam' "),
    ({"inference": "central"}, r"cannot be used with inference 'central' .*valid: inference local"),
    ({"checkpoint": {"engine": "dask"}}, r"cannot be used with checkpoint.engine 'dask' .*valid: checkpoint.engine auto"),
])
def test_learner_resources_are_refused_where_they_cannot_be_honoured(data, match):
    with pytest.raises(config_lib.ConfigError, match=match):
        config_lib.from_dict({**data, "learner": {"resources": {"GPU": 1}}})
    assert config_lib.from_dict({**data, "learner": {"resources": {}}}).learner.resources == {}


@pytest.mark.slow
def test_a_bad_learner_resources_value_is_one_line_naming_the_valid_forms(tmp_path):
    import subprocess
    import sys
    for value in ("GPU", '{"GPU": -1}'):
        out = subprocess.run([sys.executable, "-m", "pipelines.train", "--run-dir", str(tmp_path / "run"),
                              "--set", f"learner.resources={value}"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith("error: config key 'learner.resources' = ")
        assert 'valid: {} (the learner in the driver process) or a mapping of Dask resource names' in out.stderr
    assert not (tmp_path / "run").exists()
    assert config_lib.from_dict({"learner": {"resources": {"GPU": 1, "learner": 0.5}}}).learner.resources == {
        "GPU": 1.0, "learner": 0.5}
