"""``--executor beam`` (DirectRunner) runs the plan of local and Dask: the same run, bit for bit.

The default config with test_determinism's SETTINGS (4,096 env steps, 4
blocks of 1,024 rows, 2,048 learner steps, checkpoints, two evaluations)
runs locally and as Beam round pipelines; checkpointed learner parameters,
committed shard ids in log order, every stored array of every shard and the
summary's counters must be equal. Once with all 4 blocks in one round, once
on the in-memory runner, once grown from 2 to 4 blocks in rounds of 2 (the
learner restored from ``beam/learner`` and the actors from
``core.actor_state`` documents at the round boundary), and once with a round
re-run after its records are deleted. About 2-3 minutes.
"""
import json
import os

import numpy as np
import pytest

pytest.importorskip("apache_beam")

from test_determinism import SETTINGS, _assert_same_run, _replay, _run  # noqa: E402

DIRECT = ["--direct_num_workers", "2"]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("det"), "local", "local")


#: The loop fields a checkpoint carries for --resume (pipelines.run.resume.plan_state) and its counters.
PLAN_STATE = ("block", "env_steps", "episodes", "policy_version", "best_version", "versions", "pending_evals",
              "n_evals", "next_eval", "last_broadcast_step")


def _flat(tree, prefix=""):
    """``{path: array}``. Optimizer keys hold no per-process optimizer name (``core.agents.variables``), so
    checkpoints written by different processes compare key for key."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}/").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, sub in enumerate(tree) for k, v in _flat(sub, f"{prefix}{i}/").items()}
    return {prefix.rstrip("/"): np.asarray(tree)}


def _checkpoints(run_dir):
    """``{step: (every array by path, the loop's PLAN_STATE)}`` of the run's ``checkpoints/``."""
    from core.checkpoint import Checkpointer
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"), keep_last=None)
    try:
        out = {}
        for step in ckpt.all_steps():
            state, meta = ckpt.restore(step)
            loop = json.loads(meta["loop"])
            out[step] = (_flat(state), {k: loop.get(k) for k in PLAN_STATE})
        return out
    finally:
        ckpt.close()


def _assert_same_checkpoints(a_dir, b_dir, label):
    """The same checkpoints, array for array (learner, sampler, the versions a resume republishes), and the
    same plan state in their loop metadata."""
    a, b = _checkpoints(a_dir), _checkpoints(b_dir)
    assert sorted(a) == sorted(b) and a, f"{label}: checkpoint steps {sorted(a)} != {sorted(b)}"
    for step in a:
        (xa, la), (xb, lb) = a[step], b[step]
        assert sorted(xa) == sorted(xb), f"{label}: step {step} arrays {sorted(set(xa) ^ set(xb))} differ"
        for name in xa:
            assert np.array_equal(xa[name], xb[name]), f"{label}: step {step} {name} differs"
        assert la == lb, f"{label}: step {step} loop {la} != {lb}"


def _beam(tmp_path, name, pipeline_args, overrides=(), resume=False):
    from core.config import load_config
    from pipelines.train import train
    cfg = load_config(overrides=["executor=beam", *SETTINGS, *overrides])
    run_dir = os.path.join(str(tmp_path), name)
    return train(cfg, run_dir, progress=False, resume=resume, pipeline_args=pipeline_args), run_dir


@pytest.fixture(scope="module")
def beam_run(tmp_path_factory):
    return _beam(tmp_path_factory.mktemp("beam"), "beam", DIRECT)


def _rounds(run_dir):
    names = sorted(n for n in os.listdir(os.path.join(run_dir, "rounds")) if n.startswith("r0"))
    out = []
    for n in names:
        with open(os.path.join(run_dir, "rounds", n)) as f:
            record = json.load(f)
        out.append(list(range(record["first_block"], record["last_block"] + 1)))
    return out


@pytest.mark.slow
def test_beam_run_in_one_round_is_bit_identical_to_the_local_run(local_run, beam_run):
    run = beam_run
    assert run[0]["learner_steps"] == 2048 and len(_replay(run[1])) == 4
    assert _rounds(run[1]) == [[0, 1, 2, 3]]
    _assert_same_run(local_run, run, "local vs beam (one round of 4 blocks)")
    _assert_same_checkpoints(local_run[1], run[1], "local vs beam (one round of 4 blocks)")
    assert 0 < run[0]["driver_bytes_in_per_env_step"] < 0.01 * run[0]["trajectory_bytes_per_env_step"]


@pytest.mark.slow
def test_beam_run_on_the_in_memory_runner_is_bit_identical_to_the_local_run(local_run, tmp_path):
    """One process runs every stage: the learner stays in memory from block to block (no restore)."""
    run = _beam(tmp_path, "mem", ["--direct_running_mode", "in_memory"])
    workers = {json.load(open(os.path.join(run[1], "blocks", f"b{b:08d}-learn.json")))["worker"] for b in range(4)}
    assert workers == {f"{os.uname().nodename} pid {os.getpid()}"}
    _assert_same_run(local_run, run, "local vs beam (in_memory runner)")


@pytest.mark.slow
def test_a_beam_run_resumed_with_a_larger_budget_is_bit_identical(local_run, tmp_path):
    """2,048 env steps, then --resume to 4,096: the same run as local's 4,096, in rounds of 2 blocks. Block 2's
    learner restores from beam/learner and its actors from their documents. (Round boundaries inside one
    launcher run, never resumed, are the prioritized test's below: rounds of one block.)"""
    first = _beam(tmp_path, "grow", [*DIRECT, "--blocks_per_round", "2"], ["total_env_steps=2048"])
    assert first[0]["env_steps"] == 2048 and _rounds(first[1]) == [[0, 1]]
    run = _beam(tmp_path, "grow", [*DIRECT, "--blocks_per_round", "2"], resume=True)
    assert _rounds(run[1]) == [[0, 1], [2, 3]]
    docs = sorted(os.listdir(os.path.join(run[1], "blocks", "actors")))   # before tasks 2 and 4 (G = 1)
    assert docs == [f"a{a:04d}-t{t:08d}.json" for a in range(4) for t in (2, 4)]
    _assert_same_run(local_run, run, "local vs beam resumed after 2 of 4 blocks")


@pytest.mark.slow
def test_a_beam_round_killed_before_its_end_resumes_bit_identically(local_run, beam_run, tmp_path):
    """The state of a round killed after Commit3 (before Learn3's record, the round record and the
    close): --resume re-runs the round; stages with records return them, the rest run, shards are never
    rewritten, and the run ends as the local one."""
    import shutil
    run_dir = str(tmp_path / "killed")
    shutil.copytree(beam_run[1], run_dir)
    for name in ("rounds/r000000.json", "rounds/final.json", "blocks/b00000003-learn.json", "summary.json"):
        os.remove(os.path.join(run_dir, name))
    shard = os.path.join(run_dir, "replay", "shards", "s00000002")
    stamp = {n: os.stat(os.path.join(d, n)).st_mtime_ns for d, _, ns in os.walk(shard) for n in ns}
    run = _beam(tmp_path, "killed", DIRECT, resume=True)
    assert {n: os.stat(os.path.join(d, n)).st_mtime_ns for d, _, ns in os.walk(shard) for n in ns} == stamp
    _assert_same_run(local_run, run, "local vs beam killed in its round and resumed")


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_prioritized_replay_run_across_rounds_is_bit_identical_to_the_local_run(tmp_path):
    """R2D2 (prioritized sequences), 2 blocks, one block per round on 2 DirectRunner workers: each round's
    workers are new processes, so the learner of block 1 restores the learner, rebuilds its replay cache
    and takes back block 0's sampler priorities from ``beam/learner``, and every block samples what the
    local run sampled (learning from block 0: min_size 1,000 of its 1,024 rows)."""
    from core.config import load_config
    from pipelines.train import train
    from test_resume_identity import R2D2_CONFIG, R2D2_SETTINGS
    settings = [*R2D2_SETTINGS, "total_env_steps=2048", "replay.min_size=1000"]   # evaluations: the last block's
    local_dir, beam_dir = str(tmp_path / "local"), str(tmp_path / "beam")
    local = train(load_config(R2D2_CONFIG, overrides=["executor=local", *settings]), local_dir, progress=False)
    beam = train(load_config(R2D2_CONFIG, overrides=["executor=beam", *settings]), beam_dir, progress=False,
                 pipeline_args=[*DIRECT, "--blocks_per_round", "1"])
    assert local["learner_steps"] == 61 and _rounds(beam_dir) == [[0], [1]]
    _assert_same_run((local, local_dir), (beam, beam_dir), "R2D2 local vs beam (one block per round)")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_r2d2_in_rounds_of_two_blocks_is_bit_identical_to_the_local_run(tmp_path):
    """R2D2, 3 blocks in rounds [0, 1] and [2]: within round 0 the sampler's priorities stay in the learner's
    memory from block 0 to block 1; round 1's new worker takes them back from ``beam/learner``; parameters,
    shards, episodes and every counter are the local run's."""
    from core.config import load_config
    from pipelines.train import train
    from test_resume_identity import R2D2_CONFIG, R2D2_SETTINGS
    settings = [*R2D2_SETTINGS, "total_env_steps=3072", "replay.min_size=1000"]
    local_dir, beam_dir = str(tmp_path / "local"), str(tmp_path / "beam")
    local = train(load_config(R2D2_CONFIG, overrides=["executor=local", *settings]), local_dir, progress=False)
    beam = train(load_config(R2D2_CONFIG, overrides=["executor=beam", *settings]), beam_dir, progress=False,
                 pipeline_args=[*DIRECT, "--blocks_per_round", "2"])
    assert _rounds(beam_dir) == [[0, 1], [2]]
    _assert_same_run((local, local_dir), (beam, beam_dir), "R2D2 local vs beam (rounds of two blocks)")
    _assert_same_checkpoints(local_dir, beam_dir, "R2D2 local vs beam (rounds of two blocks)")


#: A 16-block run small enough to run at every round size: blocks of 2 actors x 4 envs x 16 steps = 128 rows.
#: Learner steps: 64 per block (replay ratio 0.5); a checkpoint and an evaluation after block 3 (256 steps,
#: 512 rows), 7, 11 and 15.
TINY = ["total_env_steps=2048", "env.num_envs=4", "agent.hidden=[16]", "actors.num_actors=2",
        "actors.steps_per_task=16", "replay.min_size=64", "replay.shard_max_rows=128", "learner.replay_ratio=0.5",
        "eval.every_env_steps=512", "eval.episodes=2", "eval.confirm_episodes=0", "checkpoint.every_steps=256"]

#: TINY cut to 5 blocks for rounds of one block (a round's fixed cost, ~10 s, dominates a tiny block): still
#: five round boundaries, with block 3's checkpoint and evaluation decided in one round and awaited in a later one.
TINY_5 = [*TINY, "total_env_steps=640"]


def _tiny_local(tmp_path_factory, overrides):
    from core.config import load_config
    from pipelines.train import train
    run_dir = str(tmp_path_factory.mktemp("tiny") / "local")
    return train(load_config(overrides=["executor=local", *overrides]), run_dir, progress=False), run_dir


@pytest.fixture(scope="module")
def tiny_local_run(tmp_path_factory):
    return _tiny_local(tmp_path_factory, TINY)


@pytest.fixture(scope="module")
def tiny_5_local_run(tmp_path_factory):
    return _tiny_local(tmp_path_factory, TINY_5)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("blocks_per_round, blocks", [(1, 5), (4, 16), (16, 16)])
def test_round_size_never_changes_a_run(request, tmp_path, blocks_per_round, blocks):
    """Rounds of 1 (5 blocks), 4 or 16 (16 blocks): every round boundary restores the learner from its one
    save per round, refills the replay cache in one read and reloads the actors from their documents, and the
    run is the local one, bit for bit (parameters, every shard's arrays, counters, checkpoints)."""
    from core.config import load_config
    from pipelines.train import train
    overrides, local = (TINY_5, "tiny_5_local_run") if blocks == 5 else (TINY, "tiny_local_run")
    local_run = request.getfixturevalue(local)
    run_dir = str(tmp_path / "beam")
    summary = train(load_config(overrides=["executor=beam", *overrides]), run_dir, progress=False,
                    pipeline_args=[*DIRECT, "--blocks_per_round", str(blocks_per_round)])
    assert _rounds(run_dir) == [list(range(b, b + blocks_per_round)) for b in range(0, blocks, blocks_per_round)]
    assert len(_replay(run_dir)) == blocks and len(_checkpoints(run_dir)) >= 2     # block 3's and the last
    saves = sorted(n for n in os.listdir(os.path.join(run_dir, "beam", "learner")) if n.startswith("step"))
    assert saves[-1] == f"step_{blocks:08d}" and len(saves) <= 2, saves      # after the last block; the chain keeps two
    _assert_same_run(local_run, (summary, run_dir), f"local vs beam ({blocks_per_round} blocks per round)")
    _assert_same_checkpoints(local_run[1], run_dir, f"local vs beam ({blocks_per_round} blocks per round)")
