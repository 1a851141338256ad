"""The ActorQ study across sessions: report records kept per seed, skipped when kept, never a half pair."""
import json
import os

import pytest

from benchmarks.studies import actorq_study
from core import report as report_lib
from synthetic_runs import make_run as _make_run


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


class _FakeRuns:
    """Stands in for ``run_one``: writes a finished synthetic run (or fails the listed ones) and counts calls."""

    def __init__(self, fail=()):
        self.calls, self.fail = [], set(fail)

    def __call__(self, config, precision, seed, budget, run_dir, backend, extra):
        self.calls.append((precision, seed, budget, tuple(extra)))
        if (precision, seed) in self.fail:
            return {"cmd": "fake", "rc": 1, "seconds": 1.0, "loadavg_before": 0.0, "loadavg_after": 0.0,
                    "stderr_tail": "boom"}
        ttt = 60.0 if precision == "fp32" else 30.0
        _make_run(os.path.dirname(run_dir), os.path.basename(run_dir), precision, seed, ttt, 480.0, 0.002, 0.001)
        return {"cmd": "fake", "rc": 0, "seconds": ttt, "loadavg_before": 0.0, "loadavg_after": 0.0}


def _study(tmp_path, out, *more):
    return actorq_study.main(["--tasks", "cartpole-dqn", "--out", str(tmp_path / out),
                              "--keep", str(tmp_path / "kept"), *more])


def test_kept_seeds_are_skipped_and_reported_with_the_new_ones(tmp_path, monkeypatch):
    fake = _FakeRuns()
    monkeypatch.setattr(actorq_study, "run_one", fake)
    assert _study(tmp_path, "session1", "--seeds", "2") == 0
    assert fake.calls == [("fp32", 0, 8000, ()), ("int8-dynamic", 0, 8000, ()),
                          ("fp32", 1, 8000, ()), ("int8-dynamic", 1, 8000, ())]
    setting = tmp_path / "kept" / "cartpole-dqn-actorq-8000"
    assert sorted(os.listdir(setting)) == ["fp32-s0", "fp32-s1", "int8-dynamic-s0", "int8-dynamic-s1"]
    with open(setting / "fp32-s1" / "record.json") as f:
        record = json.load(f)
    assert (record["precision"], record["seed"], record["rc"], record["label"]) == \
        ("fp32", 1, 0, "cartpole-dqn-actorq-8000")

    fake.calls.clear()                                 # a later session, a fresh --out: only seed 2 runs
    assert _study(tmp_path, "session2", "--seeds", "3") == 0
    assert fake.calls == [("fp32", 2, 8000, ()), ("int8-dynamic", 2, 8000, ())]
    with open(tmp_path / "session2" / "report" / "rows.json") as f:
        rows = json.load(f)
    assert [(r["precision"], r["seeds"], r["reached"]) for r in rows] == [("fp32", 3, 3), ("int8-dynamic", 3, 3)]
    assert rows[1]["speedup"] == pytest.approx(2.0)   # 60 s vs 30 s on every seed


def test_a_seed_with_a_failed_precision_is_not_kept_and_runs_again_whole(tmp_path, monkeypatch):
    fake = _FakeRuns(fail={("int8-dynamic", 1)})
    monkeypatch.setattr(actorq_study, "run_one", fake)
    assert _study(tmp_path, "session1", "--seeds", "2") == 0
    setting = tmp_path / "kept" / "cartpole-dqn-actorq-8000"
    assert sorted(os.listdir(setting)) == ["fp32-s0", "int8-dynamic-s0"]
    fake.calls.clear()
    fake.fail.clear()
    assert _study(tmp_path, "session2", "--seeds", "2") == 0
    # both precisions of seed 1 run again, back to back: a ratio never pairs runs from two sessions
    assert fake.calls == [("fp32", 1, 8000, ()), ("int8-dynamic", 1, 8000, ())]


def test_overrides_and_budgets_name_their_own_setting(tmp_path, monkeypatch):
    fake = _FakeRuns()
    monkeypatch.setattr(actorq_study, "run_one", fake)
    assert _study(tmp_path, "a", "--seeds", "1", "--to-target",
                  "--set", "learner.replay_ratio=0.125") == 0
    assert fake.calls[0] == ("fp32", 0, 100_000, ("learner.replay_ratio=0.125",))   # the config's budget
    assert os.listdir(tmp_path / "kept") == ["cartpole-dqn-actorq-100000--learner.replay_ratio=0.125"]


def test_bad_study_arguments_are_one_line_errors(tmp_path, capsys):
    assert actorq_study.main(["--out", str(tmp_path), "--precisions", "int8-dynamic", "fp32"]) == 2
    assert capsys.readouterr().err.strip() == \
        "error: --precisions must start with fp32 (the baseline every ratio is taken against)"
    assert actorq_study.main(["--out", str(tmp_path), "--size", "actor-bound", "--tasks", "pendulum-d4pg"]) == 2
    assert "has no --size actor-bound config" in capsys.readouterr().err
