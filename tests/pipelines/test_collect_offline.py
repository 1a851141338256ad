"""Collect a dataset from a solved CartPole policy, process it, and train offline from it.

Budget: one ~45 s local training run (session fixture) that solves CartPole,
a ~20 s collection, one offline run, and an offline run killed with SIGKILL
after its first checkpoint and resumed, next to an uninterrupted one (~40 s).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from pipelines.executors.factory import make_pass_executor  # noqa: E402
from pipelines.executors.local import LocalExecutor  # noqa: E402
from core import config as config_lib
from core.dataset import stats
from core.replay import ReplayStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def solved_run(tmp_path_factory):
    from pipelines.train import train
    run_dir = str(tmp_path_factory.mktemp("solved") / "run")
    cfg = config_lib.load_config(overrides=["executor=local"])
    summary = train(cfg, run_dir, progress=False)
    assert summary["final_eval"]["fp32"]["mean"] >= 475, summary["final_eval"]
    return run_dir


@pytest.fixture(scope="session")
def expert_store(solved_run, tmp_path_factory):
    from pipelines.collect import collect
    out = str(tmp_path_factory.mktemp("data") / "expert")
    # epsilon 0.4: a solved policy's data with failures in it (greedy data holds no terminations,
    # from which Q-learning cannot tell good actions from bad ones; BC still can).
    summary = collect(solved_run, episodes=60, out=out, precision="int8-dynamic", executor="local",
                      epsilon=0.4, num_actors=2, num_envs=8, steps_per_task=64, progress=False)
    assert summary["episodes"] >= 60 and summary["version"] == 1
    return out


def test_collect_writes_complete_episodes_in_one_commit(expert_store):
    store = ReplayStore.open(expert_store)
    assert store.latest_version() == 1 and store.log.entry(1)["meta"]["op"] == "collect"
    s = stats.compute_stats(LocalExecutor(), expert_store)
    assert s["episodes"] >= 60 and s["incomplete_episodes"] == 0
    assert s["transitions"] == s["rows"] - s["episodes"]
    assert s["return"]["max"] == 500 and s["return"]["min"] < 500  # solved policy + exploration
    assert [r["actor"] for r in s["per_actor"]] == [0, 1]


def test_collect_bad_input(solved_run, tmp_path, capsys):
    from pipelines.collect import main
    assert main([str(tmp_path / "nope"), "--episodes", "1", "--out", str(tmp_path / "o")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    assert main([solved_run, "--episodes", "0", "--out", str(tmp_path / "o")]) == 2
    assert "--episodes 0" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_offline_training_reaches_400(expert_store, tmp_path):
    from pipelines.train import print_summary, train
    # Offline double DQN (default agent) on the fixed data, within a budget of at most 30k learner steps
    # (the default's 60k env steps at a replay ratio of 0.5; the default's own 0.25 would cap it at 15k); it
    # stops at the target; a BC baseline trains on the same data. The data and the trajectory are the host's
    # (TensorFlow's kernels round differently on AVX2 and AVX-512 hosts): seed 0 reached 500 at 18,432
    # learner steps on an AVX2-only host, where a 15k cap ended at 274.
    cfg = config_lib.load_config(overrides=["eval.every_env_steps=4000", "learner.replay_ratio=0.5"])
    run_dir = str(tmp_path / "offline-dqn")
    summary = train(cfg, run_dir, progress=False, offline_dataset=expert_store)
    print_summary(summary)
    assert summary["executor"] == "offline" and summary["env_steps"] == 0
    assert summary["final_eval"]["fp32"]["mean"] >= 400, summary["final_eval"]
    assert summary["final_eval"]["int8-dynamic"]["mean"] >= 400, summary["final_eval"]
    assert summary["final_eval"]["bc-baseline"]["mean"] > 0
    with open(f"{run_dir}/summary.json") as f:
        assert json.load(f)["offline_dataset"] == ReplayStore.open(expert_store).url


def test_offline_rejects_other_env_and_empty_store(expert_store, tmp_path):
    from core.dataset.errors import DatasetError
    from pipelines.run.offline import train_offline
    cfg = config_lib.load_config(overrides=["env.id=Acrobot-v1"])
    with pytest.raises(config_lib.ConfigError, match="CartPole-v1"):
        train_offline(cfg, str(tmp_path / "r"), expert_store, progress=False)
    ReplayStore.open_or_create(str(tmp_path / "empty"), env_id="CartPole-v1")
    with pytest.raises(DatasetError, match="is empty"):
        train_offline(config_lib.load_config(), str(tmp_path / "r2"), str(tmp_path / "empty"), progress=False)
    rows = ReplayStore.open(expert_store).snapshot().num_rows
    cfg = config_lib.load_config(overrides=["replay.capacity=1000000", "replay.min_size=1000000"])
    with pytest.raises(config_lib.ConfigError, match=f"holds {rows} rows, fewer than replay.min_size 1000000; "
                                                     f"valid: --set replay.min_size={rows}$"):
        train_offline(cfg, str(tmp_path / "r3"), expert_store, progress=False)
    assert not any((tmp_path / r).exists() for r in ("r", "r2", "r3"))      # nothing written


def test_offline_resume_bad_input_is_one_line_and_writes_nothing(solved_run, expert_store, tmp_path, capsys):
    from pipelines.train import main
    # An online run is not resumed as an offline one.
    assert main(["--resume", solved_run, "--offline-dataset", expert_store, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --resume {solved_run} is not an offline run (no offline.json); valid: --resume "
                   f"{solved_run} without --offline-dataset"]
    # An offline run whose dataset changed since (here: its record names another log version).
    run = tmp_path / "changed"
    run.mkdir()
    (run / "config.json").write_text(config_lib.to_json(config_lib.load_config()))
    url = ReplayStore.open(expert_store).url
    (run / "offline.json").write_text(json.dumps({"dataset": url, "version": 7}))
    before = sorted(p.name for p in run.iterdir())
    assert main(["--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --resume {run} trained on {url} at version 7, not {url} at version 1; valid: that "
                   f"dataset, unchanged"]
    assert sorted(p.name for p in run.iterdir()) == before


#: 2,048 learner steps in 4 blocks of 512; checkpoints at 1,024 and 2,048 steps; evaluations after blocks 1 and 3
#: (so the resumed segment evaluates); no early stop.
RESUME_SETTINGS = ["total_env_steps=4096", "eval.every_env_steps=2048", "eval.episodes=10",
                   "eval.confirm_episodes=0", "eval.stop_at_target=false", "checkpoint.every_steps=1000",
                   "learner.replay_ratio=0.5"]


def _learner_state(run_dir, which="checkpoints"):
    from core.checkpoint import Checkpointer
    with Checkpointer(os.path.join(run_dir, which)) as ckpt:
        step = ckpt.latest_step()
        state, meta = ckpt.restore(step)
    return step, state, meta


def _flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {prefix + k: np.asarray(v)})
    return out


def test_offline_resume_after_sigkill_is_bit_identical(expert_store, tmp_path):
    """SIGKILL an offline run once its first checkpoint is complete; ``--resume`` ends where an uninterrupted
    run ends: the same learner state (params, optimizer, counters), best/ version and summary."""
    from core.checkpoint import Checkpointer
    from core.metrics import read_metrics
    from pipelines.train import main, train
    cfg = config_lib.load_config(overrides=RESUME_SETTINGS)
    whole = str(tmp_path / "whole")
    summary = train(cfg, whole, progress=False, offline_dataset=expert_store)

    killed = str(tmp_path / "killed")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.train", "--offline-dataset", expert_store,
                             "--run-dir", killed, "--no-progress", *[a for s in RESUME_SETTINGS for a in ("--set", s)]],
                            cwd=os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, step = time.time() + 120, None
        while step is None and time.time() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            if os.path.exists(os.path.join(killed, "checkpoints", "zarr.json")):
                with Checkpointer(os.path.join(killed, "checkpoints")) as ckpt:
                    step = ckpt.latest_step()
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    at_kill, _, meta = _learner_state(killed)
    assert step is not None and at_kill < summary["learner_steps"] == 2048, "killed after the end: not a resume test"
    assert not os.path.exists(os.path.join(killed, "summary.json"))
    assert main(["--resume", killed, "--no-progress"]) == 0     # finds its dataset in offline.json

    # It resumed (did not start over): the new segment evaluates only the versions after the checkpoint's.
    segments = [i for i, r in enumerate(read_metrics(killed)) if r["kind"] == "config"]
    assert len(segments) == 2
    resumed_evals = [r["version"] for r in read_metrics(killed)[segments[1]:] if r["kind"] == "eval"]
    assert resumed_evals and resumed_evals[0] == json.loads(meta["loop"])["policy_version"] + 1
    with open(os.path.join(killed, "summary.json")) as f:
        resumed = json.load(f)
    for key in ("learner_steps", "policy_versions", "best_version", "best_eval_return", "final_eval", "env_steps"):
        assert resumed[key] == summary[key], (key, resumed[key], summary[key])
    for which in ("checkpoints", "best"):
        (sa, a, _), (sb, b, _) = _learner_state(whole, which), _learner_state(killed, which)
        a, b = _flat(a), _flat(b)
        assert sa == sb and a.keys() == b.keys() and a
        for k in a:
            assert np.array_equal(a[k], b[k]), f"{which} step {sa}: {k} differs after the resume"


def test_bc_learner_state_round_trip():
    from core.agents.bc.config import BCConfig
    from core.agents.bc.learning import BCLearner
    from core.envs import env_spec
    a = BCLearner(env_spec("CartPole-v1"), BCConfig(hidden=[16]), seed=0)
    batch = {"observation": np.random.default_rng(0).standard_normal((3, 32, 4)).astype(np.float32),
             "action": np.random.default_rng(1).integers(0, 2, (3, 32))}
    losses = [a.step(batch)["loss"] for _ in range(20)]
    assert a.steps == 60 and losses[-1] < losses[0]
    b = BCLearner(env_spec("CartPole-v1"), BCConfig(hidden=[16]), seed=5)
    b.restore(a.state())
    obs = batch["observation"][0]
    np.testing.assert_array_equal(a.policy_model(obs).numpy(), b.policy_model(obs).numpy())
    assert b.steps == 60


def test_collected_dataset_loads_with_tfds_arrow_and_xarray(solved_run, expert_store, tmp_path):
    """A real collection, exported and read back by TFDS, pandas and xarray: every value equals the store's."""
    import os

    import pandas as pd
    import tensorflow_datasets as tfds
    import xarray as xr
    import zarr
    from core.dataset import export
    local = LocalExecutor()
    s = stats.compute_stats(local, expert_store)
    snap = ReplayStore.open(expert_store).snapshot()
    rows = {n: snap.field(n).compute(scheduler="sync") for n in ("episode_id", "step", "observation", "action",
                                                                 "reward", "terminated")}
    order = np.lexsort((rows["step"], rows["episode_id"]))
    rows = {n: v[order] for n, v in rows.items()}

    r = export.export_store(local, expert_store, "rlds", str(tmp_path / "rlds"))
    assert (r["episodes"], r["rows"], r["incomplete_episodes"]) == (s["episodes"], s["rows"], 0)
    got = {n: [] for n in ("episode_id", "observation", "action", "reward", "is_terminal")}
    returns = []
    for ep in tfds.as_numpy(tfds.builder_from_directory(str(tmp_path / "rlds")).as_dataset(split="train")):
        steps = list(ep["steps"])
        returns.append(ep["episode_return"])
        got["episode_id"] += [ep["episode_id"]] * len(steps)
        for n in ("observation", "action", "reward", "is_terminal"):
            got[n] += [st[n] for st in steps]
    order = np.argsort(got["episode_id"], kind="stable")  # episodes in store order; steps already in order
    for n, want in (("episode_id", rows["episode_id"]), ("observation", rows["observation"]),
                    ("action", rows["action"]), ("reward", rows["reward"]), ("is_terminal", rows["terminated"])):
        np.testing.assert_array_equal(np.asarray(got[n])[order], want)
    assert np.mean(returns) == pytest.approx(s["return"]["mean"], rel=1e-9)

    r = export.export_store(local, expert_store, "parquet", str(tmp_path / "pq"))
    assert (r["episodes"], r["rows"]) == (s["episodes"], s["rows"])
    df = pd.read_parquet(tmp_path / "pq").sort_values(["episode_id", "step"], kind="stable")
    np.testing.assert_array_equal(np.stack(df["observation"].to_numpy()), rows["observation"])
    np.testing.assert_array_equal(df["reward"].to_numpy(), rows["reward"])

    shard = os.path.join(expert_store, "shards", snap.shards[0].id)
    ds = xr.open_zarr(shard, consolidated=False)
    np.testing.assert_array_equal(ds["observation"].values, zarr.open_array(f"{shard}/observation", mode="r")[...])
    ckpt = os.path.join(solved_run, "checkpoints")
    step = sorted(d for d in os.listdir(ckpt) if d.startswith("step_"))[-1]
    params = xr.open_zarr(f"{ckpt}/{step}/learner/params", consolidated=False)
    group = zarr.open_group(f"{ckpt}/{step}/learner/params", mode="r")
    assert sorted(params.data_vars) == sorted(name for name, _ in group.arrays())
    for name, arr in group.arrays():
        np.testing.assert_array_equal(params[name].values, arr[...])
