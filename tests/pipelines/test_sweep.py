"""python -m pipelines.sweep: spec checks, run names, outcomes, the report, and real sweeps stopped and resumed.

Fast tests (seconds) drive the sweep with a stand-in trainer (a tiny Python script in place of
``python -m pipelines.train``) or with synthetic run directories. The slow ones run real tiny runs:
configs/default.yaml x two settings (actors.precision fp32, int8-dynamic) x two seeds = 4 runs of 2,048 env
steps (two at a time, so the stop comes in the second pair), on ``local`` and on an embedded Dask cluster,
SIGTERMed once a run finished and another had a checkpoint, and resumed; every run must finish exactly once
and end with the parameters of the same run started alone (the runs alone are shared by the two executors'
tests: the same arguments give the same run).
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from core.config import ConfigError
from pipelines.sweeps import SweepDir, SweepSpec, expand, parse_grid, parse_seeds
from pipelines.sweeps.spec import check_run_name

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ENV = {**os.environ, "PYTHONPATH": REPO}
DEFAULT = os.path.join(REPO, "configs", "default.yaml")
#: 2,048 env steps in 8 blocks of 256 (4 actors x 8 envs x 8 steps), 128 learner steps per block and a
#: checkpoint at every block end: a SIGTERM after the first one still finds the run learning (a stop after its
#: last block is no stop). No energy tracker: its thread and start-up are no part of what these tests prove.
TINY = ["total_env_steps=2048", "actors.steps_per_task=8", "replay.shard_max_rows=256", "replay.min_size=256",
        "eval.every_env_steps=512", "eval.episodes=3", "eval.confirm_episodes=0", "checkpoint.every_steps=128",
        "actors.broadcast_period=64", "carbon.backend=off", "learner.replay_ratio=0.5"]
#: learner steps of a TINY run (replay ratio 0.5)
TINY_LEARNER_STEPS = 1024


def _sweep(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "pipelines.sweep", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


# -- the spec -------------------------------------------------------------------------------------------

def test_runs_are_named_readably_and_expand_configs_x_settings_x_seeds():
    spec = SweepSpec(configs=[DEFAULT], seeds=parse_seeds("0-1,5"),
                     grid=parse_grid(["actors.precision=fp32,int8-dynamic", 'learner.resources={"GPU": 1},{}']),
                     overrides=["total_env_steps=2048"])
    runs = expand(spec)
    assert len(runs) == 1 * 2 * 2 * 3
    assert runs[0].name == 'default__actors.precision=fp32__learner.resources=-GPU-1-__s0'
    assert [r.seed for r in runs[:3]] == [0, 1, 5]
    assert runs[0].overrides == ["threads.tf_intra_op=1", "threads.tf_inter_op=1", "replay.write_threads=1",
                                 "checkpoint.write_threads=1", "total_env_steps=2048",
                                 "actors.precision=fp32", 'learner.resources={"GPU": 1}']
    assert runs[0].train_args("R")[-5:] == ["--run-dir", "R", "--executor", "local", "--no-progress"]


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "a..b", "x" * 200, None, "/abs"])
def test_unsafe_run_names_are_refused(name):
    with pytest.raises(ConfigError, match="not a safe directory name"):
        check_run_name(name)


def test_a_tampered_record_cannot_point_outside_the_sweep(tmp_path):
    spec = SweepSpec(configs=[DEFAULT], seeds=[0])
    sweep = SweepDir(str(tmp_path / "s"))
    sweep.create(spec, expand(spec))
    data = json.load(open(sweep.record_path))
    data["runs"][0]["name"] = "../../etc"
    json.dump(data, open(sweep.record_path, "w"))
    with pytest.raises(ConfigError, match="not a safe directory name"):
        sweep.load()


def test_a_spec_file_and_the_same_flags_give_the_same_runs(tmp_path):
    from pipelines.sweep import _spec_from_args, build_parser
    path = tmp_path / "spec.yaml"
    path.write_text(f"configs: [{DEFAULT}]\nseeds: 0-2\ngrid: {{actors.precision: [fp32, int8-dynamic]}}\n"
                    "set: {total_env_steps: 2048, eval.stop_at_target: false}\n")
    from_file = expand(_spec_from_args(build_parser().parse_args([str(path), "--out", "x"])))
    from_flags = expand(_spec_from_args(build_parser().parse_args(
        ["--configs", DEFAULT, "--seeds", "0-2", "--grid", "actors.precision=fp32,int8-dynamic", "--set",
         "total_env_steps=2048", "--set", "eval.stop_at_target=false", "--out", "x"])))
    assert from_file == from_flags and len(from_file) == 6


@pytest.mark.parametrize("args, message", [
    (["--configs", "configs/nope.yaml", "--seeds", "0"], "config file 'configs/nope.yaml' does not exist"),
    (["--configs", DEFAULT, "--seeds", "0", "--set", "agent.bogus=1"], "unknown config key 'agent.bogus'"),
    (["--configs", DEFAULT, "--seeds", "0", "--grid", "actors.precision=fp32,int9"], "'int9' is not valid"),
    (["--configs", DEFAULT, "--seeds", "0", "--grid", "actors.precision="], "has an empty value"),
    (["--configs", DEFAULT, "--seeds", "4-2"], "is an empty range"),
    (["--configs", DEFAULT, "--seeds", "0..3"], "is not a seed range"),
    (["--configs", DEFAULT, "--seeds", "0", "--set", "seed=3"], "is set by the sweep itself"),
], ids=["unknown-config", "bad-set-key", "bad-grid-value", "empty-grid", "empty-seeds", "bad-seeds", "reserved"])
def test_a_bad_spec_exits_2_with_one_line_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "sweep"
    proc = _sweep(*args, "--out", str(out), "--no-progress", timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not out.exists()


def test_a_malformed_out_and_a_second_sweep_into_one_directory_exit_2(tmp_path):
    proc = _sweep("--configs", DEFAULT, "--seeds", "0", "--out", "s3:/bucket/x", timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --out") and len(proc.stderr.splitlines()) == 1
    spec = SweepSpec(configs=[DEFAULT], seeds=[0])
    SweepDir(str(tmp_path / "s")).create(spec, expand(spec))
    proc = _sweep("--configs", DEFAULT, "--seeds", "0", "--out", str(tmp_path / "s"), timeout=120)
    assert proc.returncode == 2 and "already holds a sweep" in proc.stderr and len(proc.stderr.splitlines()) == 1


# -- outcomes, with a stand-in trainer ------------------------------------------------------------------

#: Writes a summary.json into its --run-dir and exits 0, or fails with one error line for seed 1.
FAKE_TRAIN = """
import json, os, sys
args = sys.argv[1:]
run_dir = args[args.index("--run-dir") + 1]
if args[args.index("--seed") + 1] == "1":
    print("Traceback...\\nerror: the env exploded at step 7", file=sys.stderr)
    sys.exit(2)
os.makedirs(run_dir)
json.dump({"best_eval_return": 9.0}, open(os.path.join(run_dir, "summary.json"), "w"))
"""


def test_a_failing_run_is_recorded_with_its_one_line_error_and_the_rest_finish(tmp_path, monkeypatch, capsys):
    from pipelines import sweep as sweep_cli
    from pipelines.sweeps import launch
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    monkeypatch.setattr(launch, "train_command", lambda args, program=None: [sys.executable, str(script), *args])
    out = str(tmp_path / "s")
    code = sweep_cli.main(["--configs", DEFAULT, "--seeds", "0-3", "--grid", "actors.precision=fp32,int8-dynamic",
                           "--out", out, "--workers", "2", "--no-progress"])
    assert code == 1
    sweep = SweepDir(out)
    _, runs = sweep.load()
    states = {r.name: sweep.read_status(r.name) for r in runs}
    failed = {n: s for n, s in states.items() if s.state == "failed"}
    assert sorted(failed) == ["default__actors.precision=fp32__s1", "default__actors.precision=int8-dynamic__s1"]
    assert all(s.error == "error: the env exploded at step 7" and s.returncode == 2 for s in failed.values())
    assert all(s.state == "done" and s.attempts == 1 for n, s in states.items() if n not in failed)
    assert "failed: default__actors.precision=fp32__s1: error: the env exploded" in capsys.readouterr().err
    # --resume tries the failed runs again, and only them
    code = sweep_cli.main(["--resume", out, "--workers", "2", "--no-progress"])
    assert code == 1
    after = {r.name: sweep.read_status(r.name) for r in runs}
    assert all(after[n].attempts == (2 if n in failed else 1) for n in after)


#: Seed 0 finishes at once; the others train until SIGTERM, then exit 130 as pipelines.train's planned stop does
#: (with FINISH set, every run finishes at once: the resume).
FAKE_LONG = """
import json, os, signal, sys, time
args = sys.argv[1:]
run_dir = args[args.index("--resume") + 1] if "--resume" in args else args[args.index("--run-dir") + 1]
if "--resume" not in args and args[args.index("--seed") + 1] != "0" and not os.environ.get("FINISH"):
    os.makedirs(os.path.join(run_dir, "checkpoints"))
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(130))
    while True:
        time.sleep(0.05)
os.makedirs(run_dir, exist_ok=True)
json.dump({"best_eval_return": 1.0}, open(os.path.join(run_dir, "summary.json"), "w"))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("executor", ["local", "dask"])
def test_a_stop_signal_stops_running_runs_and_resume_finishes_only_the_rest(tmp_path, executor, monkeypatch):
    import threading
    from pipelines.sweeps import LocalBackend, run_sweep
    from pipelines.sweeps.dask_runner import DaskBackend
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_LONG)
    program = [sys.executable, str(script)]
    spec = SweepSpec(configs=[DEFAULT], seeds=[0, 1, 2, 3])
    runs = expand(spec)
    sweep = SweepDir(str(tmp_path / "s"))
    sweep.create(spec, runs)
    backend = LocalBackend(2, program) if executor == "local" else DaskBackend(None, 2, program)
    timer = threading.Timer(4.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        result = run_sweep(sweep, runs, backend, progress=False)
    finally:
        timer.cancel()
        backend.close()
    names = [r.name for r in runs]
    assert result["signal"] == ["SIGTERM"] and result["done"] == names[:1], result
    assert result["stopped"] and sorted(result["stopped"] + result["pending"]) == names[1:], result
    assert all(sweep.read_status(n).state == "stopped" and sweep.read_status(n).returncode == 130
               for n in result["stopped"])
    # resume: the finished run is skipped, stopped runs with a (stand-in) checkpoint directory are continued
    monkeypatch.setenv("FINISH", "1")
    monkeypatch.setattr("pipelines.sweeps.runner.has_checkpoint",
                        lambda run_dir: os.path.isdir(os.path.join(run_dir, "checkpoints")))
    backend = LocalBackend(2, program)
    try:
        again = run_sweep(sweep, runs, backend, progress=False)
    finally:
        backend.close()
    assert sorted(again["done"]) == sorted(names) and not again["failed"]
    assert sweep.read_status(names[0]).attempts == 1
    assert all(sweep.read_status(n).resumed_from == "checkpoint" for n in result["stopped"])


# -- the report on synthetic runs -----------------------------------------------------------------------

def test_the_sweep_report_uses_the_aggregate_statistics(tmp_path):
    from core.report import aggregate as agg
    from pipelines.report import main as report_main
    spec = SweepSpec(configs=[DEFAULT], seeds=[0, 1, 2, 3], grid={"actors.precision": ["fp32", "int8-dynamic"]})
    runs = expand(spec)
    sweep = SweepDir(str(tmp_path / "s"))
    sweep.create(spec, runs)
    finals = {"fp32": [480.0, 500.0, 120.0, 470.0], "int8-dynamic": [500.0, 500.0, 490.0, 300.0]}
    for run in runs:
        p, s = run.setting["actors.precision"], run.seed
        d = sweep.run_dir(run.name)
        os.makedirs(d)
        solved = finals[p][s] >= 475
        json.dump({"precision": p, "final_eval": {p: {"mean": finals[p][s]}}, "best_eval_return": finals[p][s],
                   "time_to_target_s": 10.0 + s if solved else None,
                   "env_steps_to_target": 1000 * (s + 1) if solved else None}, open(os.path.join(d, "summary.json"), "w"))
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            for step, ret in ((1000, 20.0), (2000, finals[p][s])):
                f.write(json.dumps({"kind": "eval", "time": 0, "step": step, "wall_s": step / 100, "mean": ret}) + "\n")
    assert report_main(["sweep", sweep.root]) == 0
    report = json.load(open(os.path.join(sweep.root, "report.json")))
    fp32, int8 = report["groups"]
    assert (fp32["setting"], fp32["solved"], fp32["runs"]) == ("actors.precision=fp32", 2, 4)
    assert fp32["final_return_iqm"] == agg.iqm(finals["fp32"]) == 475.0
    assert fp32["final_return_ci"] == list(agg.bootstrap_ci(finals["fp32"], agg.iqm, seed=0)[1:])
    assert fp32["env_steps_to_target_median"] == 1500.0          # seeds 0 and 1 solved: 1000, 2000
    (p_int8,) = [c for c in report["improvement"] if c["x"] == "actors.precision=int8-dynamic"]
    assert p_int8["p"] == agg.probability_of_improvement(finals["int8-dynamic"], finals["fp32"])
    for name in ("report.md", "curves-default.png", "profiles.png"):
        assert os.path.getsize(os.path.join(sweep.root, name)) > 100, name
    assert "| default | actors.precision=int8-dynamic | 3/4 |" in open(os.path.join(sweep.root, "report.md")).read()


# -- real sweeps: SIGTERM partway, resume, each run equal to the same run alone -------------------------

def _params(run_dir):
    from core.checkpoint import Checkpointer
    with Checkpointer(os.path.join(run_dir, "checkpoints")) as ckpt:
        state, _ = ckpt.restore(select=["learner/params"])
    return state["learner"]["params"]


def _summaries(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == "summary"]


def _early_checkpoint(run_dir):
    """Whether the run's complete checkpoints are all from its first half (of TINY_LEARNER_STEPS):
    a run just past its first checkpoint, not one about to finish."""
    root = os.path.join(run_dir, "checkpoints")
    try:
        steps = [int(d[5:]) for d in os.listdir(root)
                 if d.startswith("step_") and os.path.exists(os.path.join(root, d, "zarr.json"))]
    except (FileNotFoundError, ValueError):
        return False
    return bool(steps) and max(steps) <= TINY_LEARNER_STEPS // 2


def _stop_partway(args, sweep_dir, timeout=600):
    """SIGTERM the sweep once a run finished and an unfinished one is early in its run, past a checkpoint."""
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.sweep", *args], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    runs = os.path.join(sweep_dir, "runs")
    while proc.poll() is None and time.time() < deadline:
        dirs = [os.path.join(runs, d) for d in (os.listdir(runs) if os.path.isdir(runs) else [])]
        done = [d for d in dirs if os.path.exists(os.path.join(d, "summary.json"))]
        if done and any(_early_checkpoint(d) for d in dirs if d not in done):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def runs_alone(tmp_path_factory):
    """``params(runs)``: each run's final parameters when started alone (``pipelines.train`` with the run's own
    arguments), started together, each once per module: the two executors' tests share them."""
    root, done = tmp_path_factory.mktemp("alone"), {}

    def params(runs):
        key = lambda run: json.dumps([run.config, run.overrides, run.seed])     # what the run's arguments hold
        todo = {key(r): r for r in runs if key(r) not in done}
        procs = []
        for i, run in enumerate(todo.values()):
            run_dir = str(root / f"{len(done) + i}-{run.name}")
            procs.append((key(run), run_dir, subprocess.Popen(
                [sys.executable, "-m", "pipelines.train", *run.train_args(run_dir)], cwd=REPO, env=ENV,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
        for k, run_dir, proc in procs:
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-3000:]
            done[k] = _params(run_dir)
        return {r.name: done[key(r)] for r in runs}
    return params


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("executor", ["local", "dask"])
def test_a_sweep_stopped_by_sigterm_and_resumed_runs_each_run_once_equal_to_the_run_alone(
        tmp_path, executor, runs_alone):
    out = str(tmp_path / "sweep")
    args = ["--configs", DEFAULT, "--seeds", "0-1", "--grid", "actors.precision=fp32,int8-dynamic",
            *[a for s in TINY for a in ("--set", s)], "--executor", executor, "--workers", "2", "--out", out,
            "--no-progress"]
    code, _, err = _stop_partway(args, out)
    assert code == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == f"stopped by SIGTERM; resume with: python -m pipelines.sweep --resume {out}"
    sweep = SweepDir(out)
    _, runs = sweep.load()
    assert len(runs) == 4
    first = {r.name: sweep.read_status(r.name) for r in runs}
    done_first = [n for n, s in first.items() if s.state == "done"]
    assert 1 <= len(done_first) < 4, first
    assert all(sweep.finished(n) for n, s in first.items() if s.state == "done")     # nothing done that is not
    assert all(s.state in ("done", "stopped", "pending") for s in first.values()), first
    assert not [s for s in first.values() if s.state == "failed"], first

    resumed = _sweep("--resume", out, "--executor", executor, "--workers", "2", "--no-progress", timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = {r.name: sweep.read_status(r.name) for r in runs}
    assert all(s.state == "done" for s in after.values()), after
    for name in done_first:                                  # finished runs were not run again
        assert after[name].attempts == 1
    for run in runs:                                         # every run finished exactly once
        assert len(_summaries(sweep.run_dir(run.name))) == 1, run.name
    continued = [n for n, s in after.items() if s.resumed_from == "checkpoint"]

    # The same runs started alone: the first that was stopped and continued and the first that never stopped.
    assert continued, f"no run was continued from a checkpoint: {after}"
    by_name = {r.name: r for r in runs}
    alone = runs_alone([by_name[continued[0]], by_name[done_first[0]]])
    for name, a in alone.items():
        b = _params(sweep.run_dir(name))
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k]), f"{name}: parameter {k} differs from the run alone"
    if executor == "local":      # the report reads the real runs: 2 groups of 2 seeds, its files beside sweep.json
        from pipelines.report import main as report_main
        assert report_main(["sweep", out]) == 0
        report = json.load(open(os.path.join(out, "report.json")))
        assert [(g["config"], g["finished"]) for g in report["groups"]] == [("default", 2)] * 2
        assert len(report["improvement"]) == 2 and os.path.exists(os.path.join(out, "curves-default.png"))


# -- a run's environment under a Dask worker ------------------------------------------------------------

def test_a_run_in_a_dask_worker_does_not_inherit_the_nannys_malloc_threshold(monkeypatch):
    from pipelines.sweeps.dask_runner import nanny_spawn_variables
    from pipelines.sweeps.launch import run_env
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")          # as a Dask nanny sets it for its worker
    assert "MALLOC_TRIM_THRESHOLD_" in nanny_spawn_variables()
    env = run_env(drop=nanny_spawn_variables())
    assert "MALLOC_TRIM_THRESHOLD_" not in env and env["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")         # the user's own value stays
    assert "MALLOC_TRIM_THRESHOLD_" not in nanny_spawn_variables()
    assert run_env(drop=nanny_spawn_variables())["MALLOC_TRIM_THRESHOLD_"] == "131072"
