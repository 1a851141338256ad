"""benchmarks/studies/time_to_solve.py: DataBloom vs SB3 DQN / PPO to a confirmed 475 on CartPole-v1.

Exact rows, table and goals on fixed records; the run order; the DataBloom side as runs of the product's
sweep with the default's own threads, executor and environment (a stand-in trainer in place of
``pipelines.train``, as tests/pipelines/test_sweep.py does); one real run (slow).
"""
import dataclasses
import json
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:   # benchmarks/ is not an installed package
    sys.path.insert(0, ROOT)

from benchmarks.studies import time_to_solve as tts  # noqa: E402
from core.config import load_config  # noqa: E402
from pipelines.sweeps import launch  # noqa: E402
from pipelines.sweeps.spec import THREAD_OVERRIDES  # noqa: E402


def _tts_run(system, seed, seconds, steps, final=500.0, status="ok"):
    return {"system": system, "seed": seed, "status": status, "reached": seconds is not None,
            "time_to_target_s": seconds, "env_steps_to_target": steps, "final_return": final}


TTS_RUNS = [_tts_run("databloom", 0, 40.0, 30_000), _tts_run("sb3-dqn", 0, 159.7, 22_000),
            _tts_run("sb3-ppo", 0, 28.0, 10_000), _tts_run("databloom", 1, 60.0, 50_000),
            _tts_run("sb3-dqn", 1, None, None, None, status="failed"), _tts_run("sb3-ppo", 1, 31.0, 16_000),
            _tts_run("databloom", 2, None, None, 151.0), _tts_run("sb3-dqn", 2, 79.2, 28_000),
            _tts_run("sb3-ppo", 2, 34.5, 14_000)]


def test_time_to_solve_rows_table_and_goals_exact():
    db, dqn, ppo = tts.summarize(TTS_RUNS, tts.SYSTEMS)
    assert (db["solved"], db["runs"], db["median_time_to_target_s"], db["median_env_steps_to_target"]) == \
        (2, 3, 60.0, 50_000.0)                                 # [40, 60, inf], [30k, 50k, inf]
    assert db["median_final_return"] == 500.0                  # [500, 500, 151]
    assert (dqn["solved"], dqn["failed"], dqn["median_time_to_target_s"]) == (2, 1, 159.7)
    assert (ppo["median_time_to_target_s"], ppo["median_env_steps_to_target"]) == (31.0, 14_000.0)
    assert tts.markdown_table([db, dqn, ppo]).splitlines() == [
        "| system | seed 0 | seed 1 | seed 2 | median time to 475 (s) | median env steps to 475 | "
        "median final return | solved |",
        "|---|---|---|---|---|---|---|---|",
        "| databloom | 40.0 s / 30k | 60.0 s / 50k | unsolved | 60.0 | 50,000 | 500.0 | 2/3 |",
        "| sb3-dqn | 159.7 s / 22k | unsolved | 79.2 s / 28k | 159.7 | 28,000 | 500.0 | 2/3 (1 failed) |",
        "| sb3-ppo | 28.0 s / 10k | 31.0 s / 16k | 34.5 s / 14k | 31.0 | 14,000 | 500.0 | 3/3 |"]
    assert tts.goal_lines([db, dqn, ppo]) == [
        "DataBloom solved 2/3 (goal: all)",
        "median s to 475: DataBloom 60.0 <= sb3-ppo 31.0? not met",
        "median s to 475: DataBloom 60.0 < sb3-dqn 159.7? met",
        "median env steps to 475: DataBloom 50,000.0 <= sb3-dqn 28,000.0? not met",
        "DataBloom reaches 475 0.52x as soon as sb3-ppo (median time; goal >= 1.5x with every seed solved): not met"]
    fast = tts.summarize([_tts_run("databloom", s, t, 20_000) for s, t in enumerate((20.0, 18.0, 25.0))]
                         + [r for r in TTS_RUNS if r["system"] == "sb3-ppo"], ("databloom", "sb3-ppo"))
    assert tts.goal_lines(fast)[-1] == ("DataBloom reaches 475 1.55x as soon as sb3-ppo (median time; goal >= 1.5x "
                                        "with every seed solved): met")          # 31.0 / 20.0


def test_time_to_solve_order_rotates_by_seed():
    assert [tts.run_order(s, tts.SYSTEMS)[0] for s in range(4)] == ["databloom", "sb3-dqn", "sb3-ppo", "databloom"]
    assert tts.run_order(1, tts.SYSTEMS) == ["sb3-dqn", "sb3-ppo", "databloom"]


def test_time_to_solve_without_sb3_one_line_error(tmp_path, monkeypatch, capsys):
    real = tts.importlib.util.find_spec
    monkeypatch.setattr(tts.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("stable_baselines3", "torch") else real(name, *a))
    out = tmp_path / "t.json"
    assert tts.main(["--seeds", "1", "--out", str(out)]) == 2
    assert capsys.readouterr().err == ('error: stable_baselines3 and torch are not installed, needed for sb3-dqn, '
                                       'sb3-ppo: pip install -e ".[bench]" (or run --systems databloom)\n')
    assert not out.exists()


# -- the DataBloom side: runs of the product's sweep ------------------------------------------------------------------

#: Stands in for pipelines.train: builds the config its arguments ask for, notes what it saw (arguments, config,
#: OMP_NUM_THREADS, cwd) in $TTS_SEEN/s<seed>.json, and writes a run directory that reached 475 at 10 + seed
#: seconds, or fails with one error line for the seed in $TTS_FAIL, or trains until SIGTERM for $TTS_HANG.
FAKE_TRAIN = """
import dataclasses, json, os, sys
from core.config import load_config
args = sys.argv[1:]
opt = lambda flag: [args[i + 1] for i, a in enumerate(args) if a == flag]
seed, run_dir = int(opt("--seed")[0]), opt("--run-dir")[0]
cfg = load_config(opt("--config")[0], opt("--set") + [f"executor={e}" for e in opt("--executor")] + [f"seed={seed}"])
config = dataclasses.asdict(cfg)
seen = {"args": args, "config": config, "omp": os.environ.get("OMP_NUM_THREADS"), "cwd": os.getcwd()}
json.dump(seen, open(os.path.join(os.environ["TTS_SEEN"], f"s{seed}.json"), "w"))
if str(seed) == os.environ.get("TTS_HANG"):            # trains until SIGTERM, then exits as a planned stop does
    import signal, time
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(130))
    open(os.path.join(os.environ["TTS_SEEN"], "hanging"), "w").close()
    while True:
        time.sleep(0.05)
if str(seed) == os.environ.get("TTS_FAIL"):
    print("Traceback...\\nerror: the env exploded at step 7", file=sys.stderr)
    sys.exit(2)
os.makedirs(run_dir)
json.dump(config, open(os.path.join(run_dir, "config.json"), "w"))
json.dump({"executor": cfg.executor, "precision": "int8-dynamic", "env_steps": 8000, "time_to_target_s": 10.0 + seed,
           "env_steps_to_target": 8000, "best_version": 1, "best_eval_return": 490.0,
           "final_eval": {"int8-dynamic": {"mean": 500.0}}}, open(os.path.join(run_dir, "summary.json"), "w"))
with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"kind": "eval", "time": 0, "step": 8000, "version": 1, "mean": 490.0,
                        "confirmed_mean": 480.0, "wall_s": 10.0 + seed}) + "\\n")
"""


@pytest.fixture
def fake_train(tmp_path, monkeypatch):
    """pipelines.train replaced by FAKE_TRAIN; returns the directory of what each run saw."""
    script, seen = tmp_path / "fake_train.py", tmp_path / "seen"
    script.write_text(FAKE_TRAIN)
    seen.mkdir()
    monkeypatch.setattr(launch, "train_command", lambda args, program=None: [sys.executable, str(script), *args])
    monkeypatch.setenv("TTS_SEEN", str(seen))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("TTS_FAIL", raising=False)
    monkeypatch.delenv("TTS_HANG", raising=False)
    return seen


def _key(config, key):
    for part in key.split("."):
        config = config[part]
    return config


def test_each_databloom_run_is_a_sweep_run_of_the_default_with_its_own_threads(tmp_path, fake_train):
    out = tmp_path / "t.json"
    assert tts.main(["--systems", "databloom", "--seeds", "2", "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["run"], r["status"], r["time_to_target_s"], r["executor"]) for r in runs] == [
        ("databloom__s0", "ok", 10.0, "dask"), ("databloom__s1", "ok", 11.0, "dask")]
    default = dataclasses.asdict(load_config(tts.DEFAULT_CONFIG, []))
    keys = [o.partition("=")[0] for o in THREAD_OVERRIDES]
    assert keys == ["threads.tf_intra_op", "threads.tf_inter_op", "replay.write_threads", "checkpoint.write_threads"]
    for seed in (0, 1):
        seen = json.loads((fake_train / f"s{seed}.json").read_text())
        # the sweep's run: its config file, seed, one-thread overrides, run directory under the sweep's runs/ ...
        assert seen["args"][:4] == ["--config", tts.DEFAULT_CONFIG, "--seed", str(seed)]
        assert seen["args"][4:12] == [a for o in THREAD_OVERRIDES for a in ("--set", o)]
        run_dir = seen["args"][seen["args"].index("--run-dir") + 1]
        assert run_dir.endswith(os.path.join("sweep", "runs", f"databloom__s{seed}"))
        # ... whose config is the shipped default's threads, executor (Dask) and evaluation, as before the sweep
        assert {k: _key(seen["config"], k) for k in keys} == {k: _key(default, k) for k in keys}
        assert {k: _key(seen["config"], k) for k in keys} == {"threads.tf_intra_op": 1, "threads.tf_inter_op": 1,
                                                             "replay.write_threads": 2, "checkpoint.write_threads": 2}
        assert "--executor" not in seen["args"] and seen["config"]["executor"] == default["executor"] == "dask"
        assert {k: v for k, v in seen["config"].items() if k not in ("seed", "run_dir")} == \
            {k: v for k, v in default.items() if k not in ("seed", "run_dir")}
        assert seen["omp"] is None and seen["cwd"] == tts.ROOT    # this environment, not the sweep's THREAD_ENV
    assert runs[0]["command"].startswith("python -m pipelines.train --config configs/default.yaml --seed 0 ")
    assert ("--set replay.write_threads=2 --set checkpoint.write_threads=2 --set eval.every_env_steps=4000 "
            "--set eval.episodes=20 --set eval.confirm_episodes=100 --set eval.target_return=475") in runs[0]["command"]


def test_executor_flag_and_set_reach_the_run_and_a_failed_run_is_recorded(tmp_path, fake_train, monkeypatch):
    monkeypatch.setenv("TTS_FAIL", "0")
    out = tmp_path / "t.json"
    assert tts.main(["--systems", "databloom", "--seeds", "2", "--executor", "local", "--set",
                     "replay.write_threads=3", "--out", str(out)]) == 0
    failed, ok = json.loads(out.read_text())["runs"]
    assert (failed["status"], failed["returncode"], failed["error"]) == ("failed", 2,
                                                                       "error: the env exploded at step 7")
    assert (ok["status"], ok["executor"], ok["reached"]) == ("ok", "local", True)
    seen = json.loads((fake_train / "s1.json").read_text())
    assert seen["args"][-3:] == ["--executor", "local", "--no-progress"]
    assert seen["config"]["replay"]["write_threads"] == 3                   # --set comes after the default's threads


def test_databloom_runs_alternate_with_sb3_one_at_a_time(tmp_path, fake_train, monkeypatch):
    calls = []
    monkeypatch.setattr(tts, "check_sb3", lambda systems: None)
    monkeypatch.setattr(tts, "run_sb3", lambda algo, seed, args: calls.append((algo, seed)) or
                        {"status": "ok", "reached": True, "time_to_target_s": 5.0, "env_steps_to_target": 1000,
                         "final_return": 500.0})
    out = tmp_path / "t.json"
    assert tts.main(["--seeds", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [(r["system"], r["seed"]) for r in data["runs"]] == [
        ("databloom", 0), ("sb3-dqn", 0), ("sb3-ppo", 0), ("sb3-dqn", 1), ("sb3-ppo", 1), ("databloom", 1)]
    assert calls == [("dqn", 0), ("ppo", 0), ("dqn", 1), ("ppo", 1)]
    assert [r["solved"] for r in data["rows"]] == [2, 2, 2]
    assert "| databloom | 10.0 s / 8k | 11.0 s / 8k |" in (tmp_path / "t.md").read_text()


def test_a_stop_signal_stops_the_run_and_the_benchmark_keeping_what_ended(tmp_path, fake_train, monkeypatch, capsys):
    import signal
    import threading
    import time
    monkeypatch.setenv("TTS_HANG", "1")

    def stop_when_hanging():
        deadline = time.monotonic() + 60
        while not (fake_train / "hanging").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_hanging, daemon=True).start()
    out = tmp_path / "t.json"
    assert tts.main(["--systems", "databloom", "--seeds", "3", "--out", str(out)]) == tts.STOPPED
    assert [r["run"] for r in json.loads(out.read_text())["runs"]] == ["databloom__s0"]   # seed 2 never started
    assert capsys.readouterr().err.startswith(f"stopped by SIGTERM: 1 runs kept in {out}")
    assert sorted(os.listdir(fake_train)) == ["hanging", "s0.json", "s1.json"]


@pytest.mark.parametrize("item, message", [
    ("nope=1", "error: run databloom__s0: unknown config key 'nope'"),
    ("executor=beam", "error: 'executor' is set by the sweep itself")])
def test_a_bad_set_is_one_line_before_any_run(tmp_path, fake_train, capsys, item, message):
    out = tmp_path / "t.json"
    assert tts.main(["--systems", "databloom", "--set", item, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.splitlines()) == 1
    assert not out.exists() and not os.listdir(fake_train)


def test_with_executor_replaces_or_drops_the_sweeps_local():
    args = ["--config", "c.yaml", "--seed", "0", "--run-dir", "r", "--executor", "local", "--no-progress"]
    assert tts.with_executor(args, None) == ["--config", "c.yaml", "--seed", "0", "--run-dir", "r", "--no-progress"]
    assert tts.with_executor(args, "dask")[-3:] == ["--executor", "dask", "--no-progress"]
    assert tts.with_executor(["--resume", "r", "--no-progress"], "dask") == ["--resume", "r", "--no-progress"]


@pytest.mark.slow
def test_time_to_solve_databloom_path(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert tts.main(["--systems", "databloom", "--seeds", "1", "--eval-every", "1024", "--executor", "local",
                     "--set", "total_env_steps=2048", "--set", "replay.min_size=500", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert (run["system"], run["seed"], run["status"], run["executor"], run["env_steps"]) == ("databloom", 0, "ok",
                                                                                          "local", 2048)
    assert "--set eval.every_env_steps=1024 --set eval.episodes=20 --set eval.confirm_episodes=100" in run["command"]
    assert [c[0] for c in run["curve"]] == [1024, 2048]   # local executor: an evaluation every 1,024 env steps
    assert data["eval"] == {"every_env_steps": 1024, "episodes": 20, "confirm_episodes": 100, "target": 475.0}
    assert data["rows"][0]["runs"] == 1 and data["rows"][0]["solved"] == int(run["reached"])
    md = (tmp_path / "t.md").read_text()
    assert "| databloom |" in md and "DataBloom solved" in md
