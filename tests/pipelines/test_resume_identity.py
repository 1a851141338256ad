"""A run killed with SIGKILL after a checkpoint and resumed ends bit-identical to an uninterrupted one.

The default config with tests/pipelines/test_determinism.py's SETTINGS (4,096 env
steps: 4 blocks, 2,048 learner steps, checkpoints at learner steps 1,024 and
2,048, two evaluations) runs once uninterrupted, in process. Each other run
is ``python -m pipelines.train`` in a subprocess, SIGKILLed once its first
complete checkpoint exists (or, for the exact cases, at a chosen point after
it), then resumed with ``--resume`` to the end. Learner parameters, committed
shard ids in log order, every stored array (episode index included) and the
summary counters must be equal (``_assert_same_run``). Unit tests pin the
parts: an actor's stored state continues its trajectory exactly, and a
damaged stored state is a one-line error that writes nothing. A short R2D2
run (prioritized sequence replay) checks that the checkpoint carries the
sampler's priorities (about 80 s). About 5 minutes in all.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from test_determinism import SETTINGS, _assert_same_run, _params, _replay, _run  # noqa: F401
from test_training import KILL_AFTER

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ENV = {**os.environ, "PYTHONPATH": REPO}
SET = [a for s in SETTINGS for a in ("--set", s)]

#: Kills itself (SIGKILL, no cleanup) right after the n-th call of ``Trainer.<where>``, once the checkpoints
#: asked so far are complete: an exact kill point, where polling from outside lands anywhere.
KILL_AT = KILL_AFTER
KILL_ENV = {**ENV, "KILL_AFTER_CHECKPOINTS": "1"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("uninterrupted"), "local", "local")


def _first_checkpoint_complete(run_dir):
    root = os.path.join(run_dir, "checkpoints")
    try:
        return any(os.path.exists(os.path.join(root, d, "zarr.json")) for d in os.listdir(root)
                   if d.startswith("step_"))
    except FileNotFoundError:
        return False


def _kill_after_first_checkpoint(run_dir, executor_args, timeout=300):
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.train", "--run-dir", run_dir, "--no-progress",
                             *executor_args, *SET], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    while not _first_checkpoint_complete(run_dir) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    err = proc.communicate()[1]
    assert proc.returncode == -signal.SIGKILL, err[-2000:]


def _resume(run_dir, *extra):
    out = subprocess.run([sys.executable, "-m", "pipelines.train", "--resume", run_dir, "--no-progress", *extra],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f), run_dir


def _resume_record(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        (record,) = [r for r in map(json.loads, f) if r["kind"] == "resume"]
    return record


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("executor", [["--executor", "local"], ["--executor", "dask", "--set", "dask.n_workers=1"]],
                         ids=["local", "dask-1-worker"])
def test_a_run_killed_after_its_first_checkpoint_and_resumed_is_bit_identical(uninterrupted, tmp_path, executor):
    run_dir = str(tmp_path / "killed")
    _kill_after_first_checkpoint(run_dir, executor)
    assert not os.path.exists(os.path.join(run_dir, "summary.json"))    # killed before its end
    resumed = _resume(run_dir)
    record = _resume_record(run_dir)
    assert record["bit_identical"] and record["actors_restored"] == [0, 1, 2, 3]
    _assert_same_run(uninterrupted, resumed, f"uninterrupted vs killed + resumed ({executor[1]})")


#: Sends itself SIGTERM (what a batch scheduler sends before it kills a job) right after the n-th commit.
SIGTERM_AT = """
import os, signal, sys
from pipelines.run import driver
n, seen = int(sys.argv[1]), [0]
original = driver.Trainer._committed
def wrapped(self, *args, **kwargs):
    original(self, *args, **kwargs)
    seen[0] += 1
    if seen[0] == n:
        os.kill(os.getpid(), signal.SIGTERM)
driver.Trainer._committed = wrapped
from pipelines.train import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sigterm_checkpoints_at_the_next_block_end_and_the_resume_is_bit_identical(uninterrupted, tmp_path):
    """SIGTERM after block 0's commit: the run finishes the learner block in flight, checkpoints there (not
    at the 1,000-step cadence), exits 130 with the resume line, and --resume ends as the uninterrupted run."""
    from core.checkpoint import Checkpointer
    run_dir = str(tmp_path / "stopped")
    stopped = subprocess.run([sys.executable, "-c", SIGTERM_AT, "1", "--run-dir", run_dir, "--no-progress",
                              "--executor", "local", *SET], cwd=REPO, env=ENV, capture_output=True, text=True,
                             timeout=300)
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        (record,) = [r for r in map(json.loads, f) if r["kind"] == "stopped"]
    assert record["signal"] == "SIGTERM" and record["block"] == 1 and record["learner_steps"] == 512
    with Checkpointer(os.path.join(run_dir, "checkpoints")) as ckpt:
        assert ckpt.all_steps() == [512]                       # the stop's own, before the first periodic one
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"interrupted at checkpoint step 512; resume with: python -m pipelines.train --resume {run_dir}")
    assert not os.path.exists(os.path.join(run_dir, "summary.json"))
    resumed = _resume(run_dir)
    _assert_same_run(uninterrupted, resumed, "uninterrupted vs SIGTERM + resumed")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sigterm_to_a_dask_runs_whole_process_group_is_the_same_planned_stop(uninterrupted, tmp_path):
    """What Slurm's scancel does: SIGTERM to every process of the job, the embedded cluster's workers too.
    The workers start with SIGTERM ignored (the driver closes them), so the rollouts and shard writes in
    flight finish, the run checkpoints at its next block end, exits 130, and --resume ends as the
    uninterrupted (local) run: a Dask run is the local run bit for bit."""
    run_dir = str(tmp_path / "stopped")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.train", "--run-dir", run_dir, "--no-progress",
                             "--executor", "dask", "--set", "dask.n_workers=2", *SET], cwd=REPO, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 300
        while proc.poll() is None and time.time() < deadline:
            if os.path.exists(metrics) and '"kind": "commit"' in open(metrics).read():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        os.killpg(proc.pid, signal.SIGTERM)                   # the driver and both Dask workers
        err = proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    with open(metrics) as f:
        (record,) = [r for r in map(json.loads, f) if r["kind"] == "stopped"]
    assert record["signal"] == "SIGTERM" and record["block"] < 3, record   # stopped before the end (4 blocks)
    assert "resume with: python -m pipelines.train --resume" in err.strip().splitlines()[-1]
    # No worker died: a killed one shows as the scheduler's "Removing worker ... lose scattered data" (the policy).
    assert "Traceback" not in err and "distributed." not in err, err[-2000:]
    assert not os.path.exists(os.path.join(run_dir, "summary.json"))
    resumed = _resume(run_dir)
    _assert_same_run(uninterrupted, resumed, "uninterrupted (local) vs a Dask run SIGTERMed as a group + resumed")


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("where, n, block, precommitted", [
    ("_committed", 3, 2, [2]),        # block 2 committed after the checkpoint: actors continue at block 3
    ("_committed", 4, 2, [2, 3]),     # blocks 2 and 3 too: nothing left to roll out, learner blocks 2, 3 see
                                      # only the plan's shards, the evaluations decide the best version
], ids=["1-block-committed-after-it", "2-blocks-committed-after-it"])
def test_a_run_killed_at_any_point_after_a_checkpoint_resumes_bit_identical(
        uninterrupted, tmp_path, where, n, block, precommitted):
    run_dir = str(tmp_path / "killed")
    killed = subprocess.run([sys.executable, "-c", KILL_AT, where, str(n), "--run-dir", run_dir, "--no-progress",
                             "--executor", "local", *SET], cwd=REPO, env=KILL_ENV, capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = _resume(run_dir)
    record = _resume_record(run_dir)
    assert record["precommitted_blocks"] == precommitted and record["block"] == block
    assert record["actor_states_from"] == f"s{max([block - 1, *precommitted]):08d}" and record["bit_identical"]
    _assert_same_run(uninterrupted, resumed, f"uninterrupted vs killed after {where} {n} + resumed")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_versions_older_than_the_checkpointed_parameters_are_republished_exactly(tmp_path):
    """broadcast_period 700 > a block's 512 learner steps and policy_lag 2: the blocks after the checkpoint
    (learner step 1,024) act with versions 1 and 2, made before it; the checkpoint carries their payloads."""
    extra = ["actors.broadcast_period=700", "actors.policy_lag=2"]
    reference = _run(tmp_path, "uninterrupted", "local", extra)
    run_dir = str(tmp_path / "killed")
    killed = subprocess.run([sys.executable, "-c", KILL_AT, "_committed", "3", "--run-dir", run_dir, "--no-progress",
                             "--executor", "local", *SET, *[a for s in extra for a in ("--set", s)]],
                            cwd=REPO, env=KILL_ENV, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = _resume(run_dir)
    assert _resume_record(run_dir)["versions_restored"] == [1, 2]
    _assert_same_run(reference, resumed, "broadcast_period 700, policy_lag 2: uninterrupted vs resumed")


# -- the parts ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def payload():
    from core.networks import mlp
    from core.quantize import PolicyQuantizer
    return PolicyQuantizer("fp32").quantize(mlp(4, [16], 2, name="q", seed=0), version=3)


def test_a_stored_actor_state_continues_the_actors_trajectory_exactly(payload, tmp_path):
    """Task 0 captures its state into a shard; a fresh actor restored from the shard's document plays
    task 1 exactly as the actor that never stopped (episodes cross the tasks)."""
    from core.replay import ReplayStore
    from core.actor_state import loads
    from core.actor import ActorSpec
    from core.rollout import StoredState, release_actors, run_rollout_task
    from pipelines.run import stages
    spec = ActorSpec("test-stored", "CartPole-v1", num_envs=3, seed=7, actor_id=2)
    explore = {"epsilon": 0.5}
    first = run_rollout_task(spec, payload, 0, 30, explore, capture_state=True)
    assert first.actor_state["task"] == 1 and first.actor_state["actor"] == 2
    plain = run_rollout_task(spec, payload, 1, 30, explore)     # the uninterrupted actor
    assert plain.actor_state is None                           # only asked tasks capture
    release_actors("test-stored")
    store_url = str(tmp_path / "replay")
    ReplayStore.open_or_create(store_url, env_id="CartPole-v1")
    stages.write_shard_stage(store_url, "s00000000", [first])
    store = ReplayStore.open(store_url)
    stages.commit_stage(store, ["s00000000"])
    stored = stages.actor_states(store, "s00000000")["2"]
    assert len(json.dumps(stored)) < len(json.dumps(first.actor_state)) / 2     # compressed in the shard
    doc = loads(stages.state_text(stored))
    assert doc == first.actor_state
    resumed_spec = ActorSpec("test-stored-2", "CartPole-v1", num_envs=3, seed=7, actor_id=2, first_task=1)
    resumed = run_rollout_task(resumed_spec, payload, 1, 30, explore, after=StoredState(doc))
    release_actors("test-stored-2")
    for name, value in plain.batch.fields().items():
        np.testing.assert_array_equal(value, resumed.batch.fields()[name], err_msg=name)
    assert plain.stats.episode_returns == resumed.stats.episode_returns
    # Episodes that started in task 0 continue in task 1 under their ids (not rebuilt from seeds).
    assert set(first.batch.episode_id[-1]) & set(resumed.batch.episode_id[0])


def test_envs_whose_state_cannot_be_captured_are_rebuilt_and_the_resume_record_says_so(tmp_path, monkeypatch):
    from core import actor_state
    from core.replay import ReplayStore
    from core.actor import ActorSpec, ActorState
    from core.rollout import capture_document
    from pipelines.run import resume, stages

    def refuse(state):
        raise actor_state.ActorStateUnsupported("ALE/Pong-v5: the emulator state is a native handle")
    monkeypatch.setattr(actor_state, "capture", refuse)
    spec = ActorSpec("test-unsupported", "CartPole-v1", num_envs=2, seed=0, actor_id=0)
    state = ActorState(spec, 0)
    doc = capture_document(state)
    state.envs.close()
    assert doc == {"unsupported": "ALE/Pong-v5: the emulator state is a native handle"}
    store = ReplayStore.open_or_create(str(tmp_path / "replay"), env_id="CartPole-v1")

    class Result:          # what write_shard_stage reads of a rollout result
        def __init__(self, batch, actor_state):
            self.batch, self.actor_state, self.stats = batch, actor_state, None
    from test_stages import _batch
    batch = _batch(4, 2, 0)
    stages.write_shard_stage(store.url, "s00000000", [Result(batch, doc)])
    stages.commit_stage(store, ["s00000000"])
    out = resume.load_actor_states(store, [spec], first_block=1)
    assert out.states == {} and out.rebuilt == {0: doc["unsupported"]}
    from pipelines.run.flight import LoopState
    record = out.record(LoopState(block=1), {}, [{"version": 2}])
    assert record["bit_identical"] is False and "fault-tolerant but not bit-identical" in record["note"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_damaged_stored_state_is_a_one_line_error_that_writes_nothing(tmp_path):
    """The last committed shard's actor document is damaged: exit 2, one line naming the shard, no file touched."""
    import base64
    import zlib
    from core.replay.schema import ATTRS_KEY
    from pipelines.run import stages
    from pipelines.train import train
    from core.config import load_config
    run_dir = str(tmp_path / "run")
    train(load_config(overrides=["executor=local", "total_env_steps=2048", "checkpoint.every_steps=1000",
                                 "eval.every_env_steps=100000"]), run_dir, progress=False)
    shard = os.path.join(run_dir, "replay", "shards", "s00000001", "zarr.json")
    meta = json.load(open(shard))
    states = meta["attributes"][ATTRS_KEY]["attrs"]["actor_states"]
    doc = json.loads(stages.state_text(states["1"]))
    doc["format"] = "something/else"        # well-formed JSON, not an actor state
    states["1"] = {"zlib": base64.b64encode(zlib.compress(json.dumps(doc).encode())).decode()}
    with open(shard, "w") as f:
        json.dump(meta, f)
    before = {os.path.join(d, n): os.stat(os.path.join(d, n)).st_mtime_ns
              for d, _, names in os.walk(run_dir) for n in names}
    out = subprocess.run([sys.executable, "-m", "pipelines.train", "--resume", run_dir, "--no-progress"],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    after = {os.path.join(d, n): os.stat(os.path.join(d, n)).st_mtime_ns
             for d, _, names in os.walk(run_dir) for n in names}
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [l for l in out.stderr.strip().splitlines() if l.startswith("error:")]   # (TensorFlow logs aside)
    assert len(errors) == 1 and out.stderr.strip().endswith(errors[0]), out.stderr[-2000:]
    assert errors[0].startswith("error: --resume: replay shard s00000001 holds a damaged state of actor 1 ("), errors
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    assert changed <= {os.path.join(run_dir, "run.lock")}, sorted(changed)


# -- prioritized replay (R2D2) --------------------------------------------------------------------

R2D2_CONFIG = os.path.join(REPO, "configs", "pomdp-cartpole-r2d2.yaml")
#: 4 blocks of 1,024 rows; learning from block 1 (min_size 2,000): 61, 92, 122 learner steps, checkpoints
#: at 61 (killed right after it) and 122; an evaluation at 3,072 env steps (in the resumed blocks 2-3).
R2D2_SETTINGS = ["total_env_steps=4096", "checkpoint.every_steps=50", "eval.every_env_steps=3072",
                 "eval.episodes=3", "eval.confirm_episodes=0"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_prioritized_replay_run_killed_after_its_first_checkpoint_resumes_bit_identical(tmp_path):
    """R2D2's prioritized sequence sampler: the checkpoint carries its priorities (``sampler/``), the
    resume restores them onto the rebuilt cache, so learner blocks 2-3 sample what they did uninterrupted."""
    from core.checkpoint import Checkpointer
    from core.config import load_config
    from pipelines.train import train
    reference_dir = str(tmp_path / "uninterrupted")
    reference = train(load_config(R2D2_CONFIG, overrides=["executor=local", *R2D2_SETTINGS]), reference_dir,
                      progress=False), reference_dir
    assert reference[0]["learner_steps"] == 122
    run_dir = str(tmp_path / "killed")
    killed = subprocess.run([sys.executable, "-c", KILL_AT, "_checkpoint", "1", "--run-dir", run_dir, "--no-progress",
                             "--config", R2D2_CONFIG, "--executor", "local",
                             *[a for s in R2D2_SETTINGS for a in ("--set", s)]],
                            cwd=REPO, env=KILL_ENV, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"))
    assert ckpt.all_steps() == [61]
    state, _ = ckpt.restore(61, select=["sampler"])
    ckpt.close()
    saved = state["sampler"]
    assert len(saved["row_id"]) == 2048 and saved["max_priority"] > 1.0     # blocks 0, 1: trained on
    resumed = _resume(run_dir)
    record = _resume_record(run_dir)
    assert record["block"] == 2 and record["bit_identical"]
    _assert_same_run(reference, resumed, "R2D2 (prioritized): uninterrupted vs killed after a checkpoint + resumed")
