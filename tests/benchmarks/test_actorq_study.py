"""The ActorQ study: report records, its spec run as a sweep (a stand-in trainer), resume, never a half pair."""
import json
import os
import subprocess
import sys

import pytest

from benchmarks.studies import actorq_study
from core import report as report_lib
from synthetic_runs import make_run as _make_run

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _with_workers(run_dir, *env_steps):
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        for n in env_steps:
            f.write(json.dumps({"kind": "workers", "time": 0, "step": n,
                                "workers": {"w0": {"env_steps": n, "env_steps_per_s": 100.0}}}) + "\n")
            f.write(json.dumps({"kind": "commit", "time": 0, "step": n, "rows": 512}) + "\n")
    return run_dir


def test_a_report_record_reads_like_its_run_and_keeps_only_what_reports_read(tmp_path):
    run = _with_workers(_make_run(tmp_path, "run", "int8-dynamic", 1, 20.0, 490.0, 0.001, 0.0005), 512, 1024)
    with open(os.path.join(run, "carbon.json"), "w") as f:
        json.dump({"energy_kwh": 0.001}, f)
    os.makedirs(os.path.join(run, "replay"))          # a run's bulk stays behind
    dest = report_lib.save_report_record(run, str(tmp_path / "kept" / "int8-dynamic-s1"), extra={"rc": 0})
    assert sorted(os.listdir(dest)) == ["carbon.json", "config.json", "metrics.jsonl", "record.json",
                                        "summary.json"]
    original, kept = report_lib.load_run(run), report_lib.load_run(dest)
    assert (kept.config, kept.summary, kept.evals) == (original.config, original.summary, original.evals)
    assert kept.workers == original.workers == {"w0": {"env_steps": 1024, "env_steps_per_s": 100.0}}
    with open(os.path.join(dest, "metrics.jsonl")) as f:
        assert [json.loads(line)["kind"] for line in f] == ["eval", "eval", "eval", "workers"]
    with open(os.path.join(dest, "record.json")) as f:
        assert json.load(f) == {"rc": 0}


def test_a_failed_save_leaves_no_record_and_an_unfinished_run_is_refused(tmp_path):
    run = _make_run(tmp_path, "run", "fp32", 0, 60.0, 500.0, 0.004, 0.002)
    dest = tmp_path / "kept" / "fp32-s0"
    with pytest.raises(TypeError):
        report_lib.save_report_record(run, str(dest), extra={"not json": object()})
    assert os.listdir(tmp_path / "kept") == []        # neither the record nor its temporary folder
    os.remove(os.path.join(run, "summary.json"))
    with pytest.raises(report_lib.ReportError, match="not a finished run directory"):
        report_lib.save_report_record(run, str(dest))


#: Stands in for ``python -m pipelines.train``: logs its call, then writes a finished synthetic run (fp32 60 s to
#: target, int8 30 s), or fails for the precision and seed in $FAKE_FAIL ("int8-dynamic:1").
FAKE_TRAIN = """
import json, os, sys
sys.path.insert(0, {tests!r})
from synthetic_runs import make_run
args = sys.argv[1:]
sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
value = lambda key, default=None: ([s.split("=", 1)[1] for s in sets if s.startswith(key + "=")] or [default])[-1]
run_dir, seed, precision = args[args.index("--run-dir") + 1], int(args[args.index("--seed") + 1]), value("actors.precision")
extra = [s for s in sets if s.startswith("learner.")]
with open({calls!r}, "a") as f:
    f.write(json.dumps([precision, seed, int(value("total_env_steps", 100000)), extra]) + "\\n")
if os.environ.get("FAKE_FAIL") == f"{{precision}}:{{seed}}":
    print("error: the env exploded", file=sys.stderr)
    sys.exit(2)
ttt = 60.0 if precision == "fp32" else 30.0
make_run(os.path.dirname(run_dir), os.path.basename(run_dir), precision, seed, ttt, 480.0, 0.002, 0.001)
"""


@pytest.fixture
def fake_train(tmp_path, monkeypatch):
    """The study's sweep runs FAKE_TRAIN; returns a function giving (and clearing) the calls made so far."""
    from pipelines.sweeps import job
    from pipelines.sweeps.launch import LocalBackend
    calls = tmp_path / "calls.jsonl"
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN.format(tests=os.path.dirname(os.path.dirname(__file__)), calls=str(calls)))
    monkeypatch.setattr(job.Executor, "backend", lambda self: LocalBackend(self.workers, [sys.executable, str(script)]))

    def taken():
        lines = calls.read_text().splitlines() if calls.exists() else []
        calls.write_text("")
        return [tuple(json.loads(line)[:3]) + (tuple(json.loads(line)[3]),) for line in lines]
    return taken


def _study(tmp_path, out, *more):
    return actorq_study.main(["--tasks", "cartpole-dqn", "--out", str(tmp_path / out), "--no-progress", *more])


def test_the_study_runs_its_spec_as_a_sweep_and_a_rerun_runs_nothing_again(tmp_path, fake_train):
    assert _study(tmp_path, "aq", "--seeds", "2", "--keep", str(tmp_path / "kept")) == 0
    assert fake_train() == [("fp32", 0, 8000, ()), ("fp32", 1, 8000, ()),
                            ("int8-dynamic", 0, 8000, ()), ("int8-dynamic", 1, 8000, ())]
    with open(tmp_path / "aq" / "report" / "rows.json") as f:
        rows = json.load(f)
    assert [(r["precision"], r["seeds"], r["reached"]) for r in rows] == [("fp32", 2, 2), ("int8-dynamic", 2, 2)]
    assert rows[1]["speedup"] == pytest.approx(2.0)   # 60 s vs 30 s on every seed
    setting = tmp_path / "kept" / "cartpole-dqn-actorq-8000"
    assert sorted(os.listdir(setting)) == ["fp32-s0", "fp32-s1", "int8-dynamic-s0", "int8-dynamic-s1"]
    with open(setting / "fp32-s1" / "record.json") as f:
        record = json.load(f)
    assert (record["precision"], record["seed"], record["returncode"], record["label"], record["run"]) == \
        ("fp32", 1, 0, "cartpole-dqn-actorq-8000", "cartpole-dqn__actors.precision=fp32__s1")
    assert _study(tmp_path, "aq", "--seeds", "2") == 0             # the same command: the sweep continues
    assert fake_train() == []
    assert _study(tmp_path, "aq", "--seeds", "3") == 2             # other runs: refused, one line


def test_a_seed_with_a_failed_precision_is_not_reported_and_runs_again(tmp_path, fake_train, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_FAIL", "int8-dynamic:1")
    assert _study(tmp_path, "aq", "--seeds", "2", "--keep", str(tmp_path / "kept")) == 0
    assert "failed: cartpole-dqn__actors.precision=int8-dynamic__s1: error: the env exploded" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / "kept" / "cartpole-dqn-actorq-8000")) == ["fp32-s0", "int8-dynamic-s0"]
    with open(tmp_path / "aq" / "report" / "rows.json") as f:
        assert [r["seeds"] for r in json.load(f)] == [1, 1]
    fake_train()
    monkeypatch.delenv("FAKE_FAIL")
    assert _study(tmp_path, "aq", "--seeds", "2") == 0
    assert fake_train() == [("int8-dynamic", 1, 8000, ())]          # only the failed run runs again


def test_to_target_and_overrides_name_their_own_setting(tmp_path, fake_train):
    assert _study(tmp_path, "a", "--seeds", "1", "--to-target", "--precisions", "fp32",
                  "--set", "learner.replay_ratio=0.125", "--keep", str(tmp_path / "kept")) == 0
    assert fake_train() == [("fp32", 0, 100_000, ("learner.replay_ratio=0.125",))]   # the config's budget
    assert os.listdir(tmp_path / "kept") == ["cartpole-dqn-actorq-100000--learner.replay_ratio=0.125"]


def test_bad_study_arguments_are_one_line_errors(tmp_path, capsys):
    assert actorq_study.main(["--out", str(tmp_path), "--precisions", "int8-dynamic", "fp32"]) == 2
    assert capsys.readouterr().err.strip() == \
        "error: --precisions must start with fp32 (the baseline every ratio is taken against)"
    assert actorq_study.main(["--out", str(tmp_path), "--size", "actor-bound", "--tasks", "pendulum-d4pg"]) == 2
    assert capsys.readouterr().err.strip() == \
        "error: task 'pendulum-d4pg' is not in the --size actor-bound spec; valid: cartpole-dqn"
    assert actorq_study.main(["--out", str(tmp_path), "--size", "small", "--quick"]) == 2
    assert "valid for --size small: --seeds 1" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "sweep.json")


@pytest.mark.slow
def test_a_tiny_study_end_to_end_produces_its_report(tmp_path):
    """2 real runs (fp32, int8-dynamic) of 1,024 env steps, 2 at once, then the ActorQ report.

    The runs use a 64x64 policy, not the study's 3x2048 (each 3x2048 run converts and checkpoints ~50M
    parameters): this test proves the path from the study's command to its report, which does not depend on
    the network's size."""
    out = tmp_path / "aq"
    tiny = ["total_env_steps=1024", "replay.min_size=256", "eval.every_env_steps=512", "eval.episodes=3",
            "eval.confirm_episodes=0", "agent.hidden=[64, 64]"]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.studies.actorq_study", "--tasks", "cartpole-dqn",
                           "--seeds", "1", "--out", str(out), "--workers", "2", "--no-progress",
                           *[a for s in tiny for a in ("--set", s)]],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "report" / "rows.json") as f:
        rows = json.load(f)
    assert [(r["precision"], r["seeds"]) for r in rows] == [("fp32", 1), ("int8-dynamic", 1)]
    assert (out / "report" / "report.md").read_text().startswith("#")
    with open(out / "study.json") as f:
        study = json.load(f)
    assert [(r["task"], r["precision"], r["status"]) for r in study["runs"]] == [
        ("cartpole-dqn", "fp32", "ok"), ("cartpole-dqn", "int8-dynamic", "ok")]
