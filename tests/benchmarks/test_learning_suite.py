"""benchmarks.studies.learning_suite: records from run dirs, exact aggregates, table, plots, the spec, one real sweep."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:   # benchmarks/ is not an installed package
    sys.path.insert(0, ROOT)

from benchmarks import common  # noqa: E402
from benchmarks.studies import learning_suite as suite  # noqa: E402
from benchmarks.studies import suite_report  # noqa: E402
from benchmarks.studies import suite_runs  # noqa: E402
from core import report as report_lib  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def _run_dir(root, name="run", summary_changes=None, evals=None, confirm=100, target=475.0):
    d = os.path.join(str(root), name)
    os.makedirs(d)
    config = {"name": "t", "seed": 3, "executor": "dask", "total_env_steps": 60_000, "env": {"id": "CartPole-v1"},
              "agent": {"algo": "dqn"}, "actors": {"precision": "int8-dynamic"},
              "eval": {"target_return": target, "confirm_episodes": confirm}}
    summary = {"executor": "dask", "precision": "int8-dynamic", "env_steps": 24_576, "wall_s": 30.5,
               "best_eval_return": 481.0, "best_version": 7, "time_to_target_s": 41.25,
               "env_steps_to_target": 24_576,
               "final_eval": {"fp32": {"mean": 499.0}, "int8-dynamic": {"mean": 488.5}}}
    summary.update(summary_changes or {})
    for key in [k for k, v in summary.items() if v == "DROP"]:
        del summary[key]
    if evals is None:   # (step, wall_s, mean, confirmed_mean)
        evals = [(8192, 20.0, 150.0, None), (16384, 30.0, 480.0, 470.0), (24576, 41.0, 490.0, 481.0)]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(summary, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"kind": "learner", "time": 0, "step": 99_999, "loss": 0.1}) + "\n")
        for i, (step, wall, mean, conf) in enumerate(evals):
            f.write(json.dumps({"kind": "eval", "time": 0, "step": step, "version": i, "mean": mean,
                                "confirmed_mean": conf, "wall_s": wall}) + "\n")
    return d


# -- record extraction ------------------------------------------------------------------------------------------------
def test_record_from_summary_and_metrics(tmp_path):
    rec = suite_report.suite_record(_run_dir(tmp_path))
    assert (rec["executor"], rec["env_id"], rec["algo"], rec["precision"]) == ("dask", "CartPole-v1", "dqn",
                                                                              "int8-dynamic")
    assert rec["reached"] is True and rec["env_steps_to_target"] == 24_576 and rec["time_to_target_s"] == 41.25
    assert rec["final_return"] == 488.5 and rec["ended_at_target"] is True   # the actors' precision, not fp32
    assert rec["best_eval_return"] == 481.0 and rec["best_confirmed_return"] == 481.0
    assert rec["env_steps"] == 24_576 and rec["total_env_steps"] == 60_000 and rec["train_wall_s"] == 30.5
    assert rec["curve"] == [[8192, 20.0, 150.0], [16384, 30.0, 480.0], [24576, 41.0, 490.0]]
    assert rec["derived"] == ["best_confirmed_return", "curve"]
    assert rec["target_return"] == 475.0


def test_record_unsolved_run(tmp_path):
    rec = suite_report.suite_record(_run_dir(tmp_path, summary_changes={
        "time_to_target_s": None, "env_steps_to_target": None, "best_version": -1,
        "final_eval": {"fp32": {"mean": 150.0}, "int8-dynamic": {"mean": 140.0}}},
        evals=[(4000, 10.0, 100.0, None), (8000, 15.0, 160.0, None)]))
    assert rec["reached"] is False and rec["env_steps_to_target"] is None and rec["time_to_target_s"] is None
    assert rec["final_return"] == 140.0 and rec["ended_at_target"] is False
    assert rec["best_eval_return"] is None and rec["best_confirmed_return"] is None


def test_record_derives_target_from_metrics_when_summary_lacks_it(tmp_path):
    # eval 2 reaches 475 unconfirmed, eval 3's confirmation is 470 < 475, eval 4 is confirmed at 480.
    evals = [(2000, 5.0, 100.0, None), (4000, 9.0, 480.0, None), (6000, 12.0, 490.0, 470.0),
             (8000, 15.5, 478.0, 480.0), (10000, 19.0, 500.0, 499.0)]
    rec = suite_report.suite_record(_run_dir(tmp_path, summary_changes={"time_to_target_s": "DROP",
                                                                      "env_steps_to_target": "DROP"}, evals=evals))
    assert (rec["env_steps_to_target"], rec["time_to_target_s"], rec["reached"]) == (8000, 15.5, True)
    assert rec["derived"] == ["best_confirmed_return", "curve", "time_to_target_s", "env_steps_to_target"]
    assert rec["best_confirmed_return"] == 499.0


@pytest.mark.parametrize("evals, confirm, expected_step", [
    ([(1, 1.0, 480.0, None), (2, 2.0, 476.0, 476.0)], 100, 2),   # unconfirmed hits do not count
    ([(1, 1.0, 480.0, None), (2, 2.0, 476.0, 476.0)], 0, 1),     # ... unless confirmation is off
    ([(1, 1.0, 480.0, 474.9)], 100, None),                      # the confirmed mean decides
    ([(2, 1.0, 100.0, None), (1, 2.0, 475.0, 475.0)], 100, 1),   # in env-step order; 475 counts
])
def test_first_hit_rule(evals, confirm, expected_step):
    records = [{"step": s, "wall_s": w, "mean": m, "confirmed_mean": c} for s, w, m, c in evals]
    hit = suite_report.first_hit(records, 475.0, confirm)
    assert (hit and hit["step"]) == expected_step if expected_step else hit is None


# -- aggregation, table, plot -----------------------------------------------------------------------------------------
def _rec(label, seed, steps, seconds, final, status="ok", target=475.0, curve=()):
    return {"label": label, "seed": seed, "status": status, "target_return": target, "reached": steps is not None,
            "env_steps_to_target": steps, "time_to_target_s": seconds, "final_return": final,
            "ended_at_target": final is not None and final >= target, "curve": [list(c) for c in curve]}


RECORDS = [_rec("A", 0, 1000, 10.0, 500.0), _rec("B", 0, 2000, 20.0, 480.0), _rec("A", 1, 3000, 30.0, 480.0),
           _rec("B", 1, None, None, 100.0), _rec("A", 2, None, None, 100.0),
           _rec("C", 0, None, None, None, status="failed", target=-200.0), _rec("C", 1, 900, 12.5, -150.0,
                                                                                target=-200.0)]


def test_suite_rows_exact():
    a, b, c = suite_report.suite_rows(RECORDS)
    # A: steps [1000, 3000, inf] -> 3000; times [10, 30, inf] -> 30; finals [500, 480, 100] -> 480
    assert a == {"config": "A", "target": 475.0, "runs": 3, "seeds": [0, 1, 2], "solved": 2, "failed": 0,
                 "ended_at_target": 2, "median_env_steps_to_target": 3000.0, "median_time_to_target_s": 30.0,
                 "median_final_return": 480.0}
    # B: [2000, inf] -> the upper middle is unsolved: no median; finals [480, 100] -> 290
    assert (b["solved"], b["median_env_steps_to_target"], b["median_time_to_target_s"]) == (1, None, None)
    assert b["median_final_return"] == 290.0
    # C: a failed run counts as a run that did not solve; its final return is not counted
    assert (c["runs"], c["solved"], c["failed"], c["median_final_return"]) == (2, 1, 1, -150.0)
    assert c["ended_at_target"] == 1 and c["median_env_steps_to_target"] is None


def test_suite_markdown_table_exact():
    table = suite_report.suite_markdown_table(suite_report.suite_rows(RECORDS))
    assert table.splitlines() == [
        "| config | target | solved | median env steps to target | median time to target (s) | "
        "median final return | final >= target |",
        "|---|---|---|---|---|---|---|",
        "| A | 475 | 2/3 | 3,000 | 30.0 | 480.0 | 2/3 |",
        "| B | 475 | 1/2 | - | - | 290.0 | 1/2 |",
        "| C | -200 | 1/2 (1 failed) | - | - | -150.0 | 1/2 |"]


def test_band_on_grid_median_and_min_max():
    xs = [np.array([0.0, 10.0]), np.array([0.0, 5.0]), np.array([0.0, 10.0])]
    ys = [np.array([0.0, 100.0]), np.array([10.0, 60.0]), np.array([30.0, 30.0])]
    grid, mid, lo, hi = report_lib.band_on_grid(xs, ys, points=3, center="median")
    assert list(grid) == [0.0, 5.0, 10.0]
    # at x=5: 50, 60, 30; at x=10: 100, 60 (held after its last point), 30
    assert list(mid) == [10.0, 50.0, 60.0] and list(lo) == [0.0, 30.0, 30.0] and list(hi) == [30.0, 60.0, 100.0]


def test_write_suite_report_writes_one_png_per_config(tmp_path):
    records = [_rec("configs/x.yaml", 0, 2000, 20.0, 480.0, curve=[(1000, 5.0, 100.0), (2000, 9.0, 480.0)]),
               _rec("configs/x.yaml", 1, None, None, 200.0, curve=[(1000, 6.0, 50.0), (3000, 12.0, 200.0)]),
               _rec("configs/y.yaml inference=central", 0, None, None, None, status="failed")]
    result = suite_report.write_suite_report(records, str(tmp_path / "rep"), notes=["commit abc"])
    names = sorted(os.path.basename(f) for f in result["files"])
    assert names == ["configs-x-yaml.png", "configs-y-yaml-inference-central.png", "learning-suite.md"]
    for f in result["files"][:2]:
        with open(f, "rb") as fh:
            assert fh.read(8) == PNG
    md = (tmp_path / "rep" / "learning-suite.md").read_text()
    assert "| configs/x.yaml | 475 | 1/2 | - | - | 340.0 | 1/2 |" in md and "- commit abc" in md
    assert "![configs-x-yaml.png](configs-x-yaml.png)" in md


# -- spec, selection, records file -------------------------------------------------------------------------------------
def _args(*argv):
    return suite.build_parser().parse_args(list(argv))


def _names(*argv):
    from pipelines.sweeps.spec import expand
    return [r.name for r in expand(suite.study_spec(_args(*argv)))]


def test_the_suite_spec_runs_every_shipped_config_and_the_central_variant():
    from pipelines.sweeps.spec import expand
    spec = suite.study_spec(_args())
    shipped = sorted(os.path.relpath(os.path.join(d, n), ROOT) for d, _, names in os.walk(os.path.join(ROOT, "configs"))
                     for n in names if n.endswith(".yaml"))
    assert sorted({suite_runs.repo_path(e.config) for e in spec.entries()}) == shipped
    runs = expand(spec)
    assert len(runs) == 10 + 18 * 5 and len(shipped) == 18
    assert [r.name for r in runs if r.config.endswith("cartpole-vtrace.yaml")] == \
        [f"cartpole-vtrace__s{s}" for s in range(5)] + [f"cartpole-vtrace-central__s{s}" for s in range(5)]


@pytest.mark.parametrize("argv, expected", [
    (("--configs", "default.yaml"), [f"default__s{s}" for s in range(10)]),
    (("--configs", "default.yaml", "pendulum-d4pg.yaml", "--seeds", "2"),
     ["default__s0", "default__s1", "pendulum-d4pg__s0", "pendulum-d4pg__s1", "actorq-pendulum-d4pg__s0",
      "actorq-pendulum-d4pg__s1"]),      # a file name matches configs/ and configs/actorq/ alike
    (("--configs", "default.yaml", "configs/pendulum-d4pg.yaml", "--seeds", "1", "--default-seeds", "2"),
     ["default__s0", "default__s1", "pendulum-d4pg__s0"]),
    (("--configs", "*vtrace*", "--exclude", "configs/pong-vtrace.yaml", "* inference=central", "--seeds", "1"),
     ["cartpole-vtrace__s0"]),
    (("--configs", "cartpole-vtrace-central", "--seeds", "1"), ["cartpole-vtrace-central__s0"]),
    (("--quick",), ["default__s0", "default__s1", "cartpole-vtrace__s0", "cartpole-vtrace__s1"]),
    (("--quick", "--seeds", "1"), ["default__s0", "cartpole-vtrace__s0"]),
])
def test_selection_and_seeds_narrow_the_spec(argv, expected):
    assert _names(*argv) == expected


def test_labels_are_the_config_path_and_its_overrides_in_order(tmp_path):
    from pipelines.sweeps import SweepDir
    from pipelines.sweeps.spec import expand
    spec = suite.study_spec(_args("--quick", "--seeds", "1", "--set", "eval.episodes=3"))
    runs = expand(spec)
    sweep = SweepDir(str(tmp_path / "s"))
    sweep.create(spec, runs)
    os.makedirs(os.path.dirname(sweep.run_dir(runs[0].name)), exist_ok=True)
    os.rename(_run_dir(tmp_path, "r0"), sweep.run_dir(runs[0].name))   # one finished run, one never started
    (rec,) = suite.suite_records(sweep, runs, "c0ffee", False)
    assert rec["label"] == "configs/default.yaml total_env_steps=40000 eval.episodes=3"
    assert (rec["status"], rec["seed"], rec["final_return"], rec["git_commit"]) == ("ok", 0, 488.5, "c0ffee")
    assert rec["command"].startswith("python -m pipelines.train --config configs/default.yaml --seed 0 --set ")


def test_quick_plan(capsys):
    assert suite.main(["--quick", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5 and out[-1].startswith("4 runs -> ")
    assert "--config " in out[1] and "--seed 1 " in out[1] and "--set total_env_steps=40000 " in out[1]


def test_bad_input_one_line_errors(tmp_path, capsys):
    assert suite.main(["--configs", "nope*", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --configs 'nope*' matches no config of the spec; its configs: configs/actorq/") \
        and err.count("\n") == 1
    assert suite.main(["--configs", "default.yaml", "--set", "agent.n_step=0", "--runs-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: run default__s0: config key 'agent.n_step'")
    assert suite.main(["--run-timeout", "5", "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith("error: --run-timeout is gone: ")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    assert suite.main(["--out", str(bad), "--render-only"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {bad} is not a learning-suite records file")
    assert bad.read_text() == "[1, 2"   # nothing overwritten


def test_records_upsert_and_render_pick_one_commit(tmp_path):
    commit = common.git_state()[0]
    out = str(tmp_path / "s.json")
    recs = [dict(_rec("configs/default.yaml total_env_steps=2048", s, 1024, 5.0, 480.0), git_commit=commit,
                 date=f"2026-01-0{s + 1}", command="python -m pipelines.train ...", process_wall_s=9.0) for s in (0, 1)]
    old = dict(recs[0], git_commit="0" * 40, final_return=1.0, date="2025-01-01")
    suite.save_records(out, [old] + recs)
    records = suite.load_records(out)
    suite.upsert(records, dict(recs[1], final_return=490.0))
    assert len(records) == 3 and records[2]["final_return"] == 490.0
    result = suite.render(records, str(tmp_path / "rep"), None)
    assert [r["runs"] for r in result["rows"]] == [2]   # the other commit's record is left out
    assert suite.render(records, str(tmp_path / "rep0"), "0000")["rows"][0]["median_final_return"] == 1.0


def test_render_keeps_each_label_at_its_own_newest_commit(tmp_path):
    """A later sweep of one config replaces that config's rows only; HEAD wins for a label it recorded."""
    a, b, head = "a" * 40, "b" * 40, "c" * 40
    recs = [dict(_rec("x", 0, 1024, 5.0, 480.0), git_commit=a, date="2026-01-01"),
            dict(_rec("y", 0, 1024, 5.0, 100.0), git_commit=a, date="2026-01-01"),
            dict(_rec("y", 0, 1024, 5.0, 300.0), git_commit=b, date="2026-01-03"),
            dict(_rec("x", 0, 1024, 5.0, 490.0), git_commit=head, date="2026-01-02")]
    picked = suite.latest_per_label(recs, head)
    assert [(r["label"], r["git_commit"]) for r in picked] == [("y", b), ("x", head)]
    assert suite.latest_per_label(recs, None) == [recs[2], recs[3]]
    recs = [dict(r, command="python -m pipelines.train ...") for r in recs]
    result = suite.render(recs, str(tmp_path / "rep"), None)
    assert sorted((r["config"], r["median_final_return"]) for r in result["rows"]) == [("x", 490.0), ("y", 300.0)]
    md = (tmp_path / "rep" / "learning-suite.md").read_text()
    assert f"- commit {b}: y" in md and f"- commit {head}: x" in md


# -- a real sweep (2 tiny runs) -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_suite_end_to_end_two_tiny_runs_then_resume(tmp_path):
    out, runs = tmp_path / "suite.json", tmp_path / "runs"
    cmd = [sys.executable, "-m", "benchmarks.studies.learning_suite", "--configs", "configs/default.yaml",
           "--seeds", "2", "--set", "total_env_steps=2048", "--set", "eval.every_env_steps=1024",
           "--set", "replay.min_size=500", "--out", str(out), "--runs-dir", str(runs), "--no-progress",
           "--workers", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = json.loads(out.read_text())["runs"]
    assert [(r["status"], r["seed"], r["returncode"]) for r in recs] == [("ok", 0, 0), ("ok", 1, 0)]
    rec = recs[0]
    assert (rec["config"], rec["executor"], rec["target_return"]) == ("configs/default.yaml", "local", 475.0)
    assert rec["env_steps"] == 2048 and rec["total_env_steps"] == 2048
    assert isinstance(rec["reached"], bool) and (rec["env_steps_to_target"] is None) == (not rec["reached"])
    assert isinstance(rec["final_return"], float) and rec["curve"] and rec["curve"][-1][0] == 2048
    assert 0 < rec["curve"][-1][1] < rec["process_wall_s"]   # eval seconds count from the train process's start
    assert rec["git_commit"] == common.git_state()[0] and rec["machine"]["cores"] == os.cpu_count()
    assert rec["command"].startswith("python -m pipelines.train --config configs/default.yaml --seed 0 --set ")
    assert os.path.exists(os.path.join(rec["run_dir"], "summary.json")) and os.path.exists(rec["log"])
    report = tmp_path / "suite"
    png = report / "configs-default-yaml-total-env-steps-2048-eval-every-env-steps-1024-replay-min-size-500.png"
    assert png.read_bytes()[:8] == PNG
    assert "| configs/default.yaml total_env_steps=2048 eval.every_env_steps=1024 replay.min_size=500 | 475 | " \
           in (report / "learning-suite.md").read_text()
    refused = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "valid: --resume to continue it" in refused.stderr
    again = subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "2 runs: 2 done, 0 failed" in again.stdout   # nothing ran again
    assert json.loads(out.read_text())["runs"] == recs
