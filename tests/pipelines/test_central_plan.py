"""SEED central inference runs the training plan: same config + seed => the same run (pipelines/run/central.py).

Central mode is the driver's :class:`~pipelines.run.plan.TrainingPlan` with the
rollout tasks played through the inference server: the server answers each
task's steps with the version and exploration the plan grants it and samples
actions with the task's own RNG, so two runs give bit-identical learner
parameters and committed replay (every shard array, the episode index
included), on the local executor and on Dask (1 and 2 workers); and the
same run as local (actor-side) inference. That rests on LiteRT rows not
depending on the batch they run in (the server batches whatever arrives),
which the first test checks at fp32 and int8-dynamic (int8-full, the R2D2
step model and the Nature CNN held as well when measured, 2026-12-01).

V-trace CartPole, 4,096 env steps (4 blocks of 1,024 rows), learning from
1,024 rows at replay ratio 0.01 (several policy versions, two of them live
at once with policy lag 1), an evaluation at 2,048. A run SIGKILLed after a
checkpoint and resumed with ``--resume`` ends bit-identical too (the server
stores and continues every actor's state, :mod:`core.inference.states`).
About 40 s, plus about 75 s for the two resume cases.
"""
import os

import numpy as np
import pytest

from core.config import load_config
from test_determinism import _assert_same_run, _replay

SETTINGS = ["inference=central", "total_env_steps=4096", "eval.every_env_steps=2048", "eval.episodes=10",
            "eval.confirm_episodes=0", "replay.min_size=1024", "learner.replay_ratio=0.01"]


def _run(tmp_path, name, executor, overrides=()):
    from pipelines.train import train
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"),
                      [f"executor={executor}", *SETTINGS, *overrides])
    run_dir = os.path.join(str(tmp_path), name)
    return train(cfg, run_dir, progress=False), run_dir


@pytest.mark.parametrize("precision", ["fp32", "int8-dynamic"])
def test_litert_rows_do_not_depend_on_the_batch_they_run_in(precision):
    """The premise of batching across actors: a row's output is the same at every batch size and position."""
    from core.inference.runners import LiteRTRunner
    from core.networks import mlp
    from core.policy import LiteRTPolicy
    from core.quantize import PolicyQuantizer
    payload = PolicyQuantizer(precision).quantize(mlp(4, [64, 64], 2, name="policy", seed=0), version=1)
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(8, 4)).astype(np.float32)
    alone = LiteRTPolicy(payload, batch_size=8)(rows)          # what a local actor of 8 envs computes
    for chunk in (1, 3, 8, 32):
        runner = LiteRTRunner(payload, max_batch_size=32, chunk_rows=chunk)
        for n, at in ((8, 0), (13, 5), (32, 0), (32, 24), (29, 11)):
            batch = (10 * rng.normal(size=(n, 4))).astype(np.float32)
            batch[at:at + 8] = rows
            assert np.array_equal(runner(batch)[at:at + 8], alone), (chunk, n, at)


@pytest.fixture(scope="module")
def central_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("central"), "local-a", "local")


@pytest.mark.slow
def test_two_central_runs_are_bit_identical(central_run, tmp_path):
    again = _run(tmp_path, "local-b", "local")
    summary = central_run[0]
    assert summary["env_steps"] == 4096 and summary["learner_steps"] == 40 and summary["policy_versions"] >= 4
    replay = _replay(central_run[1])
    assert [sid for sid, _ in replay] == ["s00000000", "s00000001", "s00000002", "s00000003"]
    versions = [sorted(np.unique(x["policy_version"]).tolist()) for _, x in replay]
    assert versions[0] == versions[1] == [1] and versions[3] != [1]     # the plan's versions, lag 1
    _assert_same_run(central_run, again, "central vs central")
    assert summary["inference"]["rejected"] == 0 and summary["inference"]["connections"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_central_on_dask_is_bit_identical_to_central_local(central_run, tmp_path, workers):
    """Dask runs a worker's actors in one task (one event loop); the server and the plan do the rest."""
    run = _run(tmp_path, "dask", "dask", [f"dask.n_workers={workers}"])
    assert run[0]["inference"]["address"].startswith("127.0.0.1:") and run[0]["inference"]["connections"] == 4
    _assert_same_run(central_run, run, f"central local vs central dask-{workers}")


@pytest.mark.slow
def test_central_inference_gives_the_run_local_inference_gives(central_run, tmp_path):
    """The server plays each task as a local actor would (same envs, ids, versions, exploration, RNG and
    LiteRT rows), so where the policy runs is an executor choice: parameters and replay are the same."""
    settings = [s for s in SETTINGS if s != "inference=central"]
    from pipelines.train import train
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"), ["executor=local", *settings])
    run_dir = os.path.join(str(tmp_path), "local-inference")
    _assert_same_run(central_run, (train(cfg, run_dir, progress=False), run_dir), "central vs local inference")
    # Each block's shard stores every actor's state after it (what --resume continues): the server joins the
    # env-only actor's envs and its own bookkeeping into the very document a local actor captures.
    from core.replay import ReplayStore
    from pipelines.run import stages
    central, local = ReplayStore.open(os.path.join(central_run[1], "replay")), ReplayStore.open(os.path.join(run_dir, "replay"))
    for b in range(4):
        sid = stages.shard_id_for(b)
        want = {a: stages.state_text(d) for a, d in stages.actor_states(local, sid).items()}
        assert sorted(want) == ["0", "1", "2", "3"]
        assert {a: stages.state_text(d) for a, d in stages.actor_states(central, sid).items()} == want, sid


@pytest.mark.slow
def test_a_killed_actor_is_started_again_and_replays_its_task(tmp_path, monkeypatch):
    """SIGKILL an actor process mid-run: it is started again, reconnects and plays its unfinished task
    again from fresh envs (fault-tolerant, not bit-identical): every planned shard is committed, once,
    and no (episode, step) row is in replay twice."""
    import signal
    from pipelines.run import central
    grant = central.CentralTrainer._submit_rollout

    def kill_actor_1_at_task_2(self, f, a, k, block, retry=0):
        if (a, k) == (1, 2):
            os.kill(self.actors[1].process.pid, signal.SIGKILL)      # mid task 1 or 2
        return grant(self, f, a, k, block, retry)

    monkeypatch.setattr(central.CentralTrainer, "_submit_rollout", kill_actor_1_at_task_2)
    summary, run_dir = _run(tmp_path, "killed", "local", ["eval.every_env_steps=100000"])
    assert summary["env_steps"] == 4096 and summary["inference"]["connections"] == 5
    replay = _replay(run_dir)
    assert [sid for sid, _ in replay] == [f"s{b:08d}" for b in range(4)]
    rows = np.concatenate([np.stack([x["episode_id"], x["step"]], -1).reshape(-1, 2) for _, x in replay])
    assert len(np.unique(rows, axis=0)) == len(rows) == 4096
    incarnation = np.concatenate([(x["episode_id"] >> 53).reshape(-1) for _, x in replay])
    assert set(np.unique(incarnation)) == {0, 1}                    # actor 1's rows after the kill


#: A checkpoint every 15 learner steps lands at learner block 1 (20 steps) and at the end (40).
RESUME_SETTINGS = ["checkpoint.every_steps=15"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("where, n, block, states_from", [
    ("_checkpoint", 1, 2, "s00000001"),    # right after the first checkpoint: actors continue at block 2
    ("_committed", 3, 2, "s00000002"),     # block 2 committed after it too: actors continue at block 3
], ids=["after-the-first-checkpoint", "a-block-committed-after-it"])
def test_a_central_run_killed_after_a_checkpoint_and_resumed_is_bit_identical(
        central_run, tmp_path, where, n, block, states_from):
    """SIGKILL the learner process (server and trainer) at an exact point after its first checkpoint,
    then ``--resume``: the server hands every env-only actor its stored env state (from the last committed
    block's shard) and continues its episode ids, steps and returns, so the run ends as one never killed."""
    import json
    import signal
    import subprocess
    import sys
    from test_resume_identity import KILL_AT, KILL_ENV, REPO, _resume, _resume_record
    run_dir = str(tmp_path / "killed")
    args = [a for s in [*SETTINGS, *RESUME_SETTINGS] for a in ("--set", s)]
    killed = subprocess.run([sys.executable, "-c", KILL_AT, where, str(n), "--config",
                             os.path.join("configs", "cartpole-vtrace.yaml"), "--run-dir", run_dir, "--no-progress",
                             "--executor", "local", *args], cwd=REPO, env=KILL_ENV, capture_output=True, text=True,
                            timeout=200)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not os.path.exists(os.path.join(run_dir, "summary.json"))      # killed before its end
    resumed = _resume(run_dir)
    record = _resume_record(run_dir)
    assert record["block"] == block and record["actor_states_from"] == states_from, record
    assert record["actors_restored"] == [0, 1, 2, 3] and record["bit_identical"], record
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        (served,) = [r for r in map(json.loads, f) if r["kind"] == "inference"]     # the resumed server's
    assert served["connections"] == 4 and served["rejected"] == 0
    _assert_same_run(central_run, resumed, f"central: uninterrupted vs killed after {where} {n} + resumed")
