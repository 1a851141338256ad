"""pipelines.report: exact table values from synthetic runs, plots written, one-line errors."""
import json
import os

import pytest

from core import report as report_lib
from synthetic_runs import make_run as _make_run


def test_table_values_exact(tmp_path):
    dirs = [_make_run(tmp_path, "a", "fp32", 0, 60.0, 500.0, 0.004, 0.002),
            _make_run(tmp_path, "b", "fp32", 1, 40.0, 480.0, 0.002, 0.001),
            _make_run(tmp_path, "c", "int8-dynamic", 0, 20.0, 490.0, 0.001, 0.0005, name="other-name"),
            _make_run(tmp_path, "d", "int8-dynamic", 1, None, 470.0, 0.001, 0.0005)]
    rows = report_lib.summarize(report_lib.load_runs(dirs))
    fp32, int8 = rows
    assert (fp32["precision"], int8["precision"]) == ("fp32", "int8-dynamic")
    assert fp32["time_to_target_s"] == 50.0 and fp32["reached"] == 2 and fp32["speedup"] == 1.0
    assert int8["time_to_target_s"] == 20.0 and int8["reached"] == 1
    assert int8["speedup"] == pytest.approx(2.5)                       # 50 / 20
    assert int8["final_rel"] == pytest.approx((480.0 - 490.0) / 490.0)  # means 480 vs 490
    assert int8["energy_ratio"] == pytest.approx(3.0)                  # 0.003 / 0.001
    assert int8["carbon_ratio"] == pytest.approx(3.0)                  # 0.0015 / 0.0005
    table = report_lib.markdown_table(rows)
    assert "| CartPole-v1 dqn | int8-dynamic | 2 | 475 | 1/2 | 20.0 |" in table
    assert "2.50x" in table and "-2.0%" in table and "3.00x" in table


def test_ratio_plots_show_the_per_seed_median_and_its_spread(tmp_path):
    """speedup.png / carbon.png plot what the spread table says (each seed against fp32 of the same seed),
    not the table's ratio of means (50 / 30 = 1.67x here, where the seeds say 3x and 1x)."""
    dirs = [_make_run(tmp_path, "a", "fp32", 0, 60.0, 500.0, 0.004, 0.002),
            _make_run(tmp_path, "b", "fp32", 1, 40.0, 480.0, 0.002, 0.001),
            _make_run(tmp_path, "c", "int8-dynamic", 0, 20.0, 490.0, 0.001, 0.0005),
            _make_run(tmp_path, "d", "int8-dynamic", 1, 40.0, 470.0, 0.001, 0.001),
            _make_run(tmp_path, "e", "int8-full", 0, None, 470.0, 0.001, None)]
    runs = report_lib.load_runs(dirs)
    from core.report.actorq import paired_ratios
    paired = paired_ratios(runs)
    speed, carbon = report_lib.ratio_bars(paired, "time_to_target"), report_lib.ratio_bars(paired, "carbon")
    assert speed == [{"label": "CartPole-v1 dqn\nint8-dynamic (n=2)", "median": 2.0, "lo": 1.0, "hi": 3.0, "n": 2},
                     {"label": "CartPole-v1 dqn\nint8-full (n=0)", "median": 0.0, "lo": 0.0, "hi": 0.0, "n": 0}]
    assert [(b["median"], b["lo"], b["hi"]) for b in carbon] == [(2.5, 1.0, 4.0), (0.0, 0.0, 0.0)]
    assert report_lib.summarize(runs)[1]["speedup"] == pytest.approx(50.0 / 30.0)     # the table's ratio of means
    report_lib.plot_bars(speed, "time-to-target speedup", str(tmp_path / "speedup.png"))
    with open(tmp_path / "speedup.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_curves_mean_and_band_across_seeds(tmp_path):
    dirs = [_make_run(tmp_path, "a", "fp32", 0, 60.0, 500.0, 0.004, 0.002),
            _make_run(tmp_path, "b", "fp32", 2, 40.0, 480.0, 0.002, 0.001)]
    grid, mean, lo, hi = report_lib.curves(report_lib.load_runs(dirs), "step", points=5)["fp32"]
    assert list(grid) == [2000.0, 3500.0, 5000.0, 6500.0, 8000.0]
    # seed 0: linear between (2000, 20), (4000, 200), (8000, 480); seed 2 adds 2
    assert list(mean) == [21.0, 156.0, 271.0, 376.0, 481.0]
    assert list(lo) == [20.0, 155.0, 270.0, 375.0, 480.0] and list(hi) == [22.0, 157.0, 272.0, 377.0, 482.0]


def test_cli_writes_plots_and_table(tmp_path, capsys):
    from pipelines.report import main
    dirs = [_make_run(tmp_path, "a", "fp32", 0, 60.0, 500.0, 0.004, 0.002),
            _make_run(tmp_path, "c", "int8-dynamic", 0, 20.0, 490.0, 0.001, 0.0005)]
    out = tmp_path / "rep"
    assert main(dirs + ["--out", str(out)]) == 0
    for name in ("report.md", "rows.json", "speedup.png", "carbon.png", "returns-cartpole-v1-dqn.png"):
        assert (out / name).stat().st_size > 0, name
    with open(out / "speedup.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "| CartPole-v1 dqn | int8-dynamic |" in capsys.readouterr().out


def test_differing_configs_one_line_error(tmp_path, capsys):
    from pipelines.report import main
    dirs = [_make_run(tmp_path, "a", "fp32", 0, 60.0, 500.0, 0.004, 0.002),
            _make_run(tmp_path, "c", "int8-dynamic", 0, 20.0, 490.0, 0.001, 0.0005, agent__n_step=5,
                      actors__num_actors=2)]
    assert main(dirs + ["--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: runs of task 'CartPole-v1 dqn' differ in actors.num_actors, agent.n_step; "
                   "configs may differ only in actors.precision and seed")


def test_not_a_run_dir_one_line_error(tmp_path, capsys):
    from pipelines.report import main
    assert main([str(tmp_path / "nope"), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "not a finished run directory" in err and "\n" not in err


def test_tasks_may_differ_between_groups(tmp_path):
    dirs = [_make_run(tmp_path, "a", "fp32", 0, 60.0, 500.0, 0.004, 0.002),
            _make_run(tmp_path, "b", "fp32", 0, 60.0, -150.0, 0.004, 0.002, env__id="Pendulum-v1",
                      agent__algo="d4pg")]
    rows = report_lib.summarize(report_lib.load_runs(dirs))
    assert [r["task"] for r in rows] == ["CartPole-v1 dqn", "Pendulum-v1 d4pg"]


def test_training_curve_pools_commit_records_per_window_exactly():
    from benchmarks.studies.suite_report import training_curve
    commits = [{"kind": "commit", "step": 960, "episodes": 1, "return_sum": -21.0},
               {"kind": "commit", "step": 1920, "episodes": 0, "return_sum": 0.0},
               {"kind": "commit", "step": 2000, "episodes": 2, "return_sum": -39.0},   # on the window's edge
               {"kind": "commit", "step": 2880, "episodes": 0, "return_sum": 0.0},
               {"kind": "commit", "step": 6100, "episodes": 4, "return_sum": -70.0},
               {"kind": "commit", "step": 7000}]                                      # an older record: skipped
    assert training_curve(commits, 2000) == [
        {"env_steps": 2000, "episodes": 3, "mean_return": -20.0},
        {"env_steps": 4000, "episodes": 0, "mean_return": None},
        {"env_steps": 8000, "episodes": 4, "mean_return": -17.5}]
    with pytest.raises(ValueError, match="valid: > 0"):
        training_curve(commits, 0)


def test_learning_curve_cli_reads_a_running_run_and_plots(tmp_path, capsys):
    from benchmarks.studies import learning_curve
    run = tmp_path / "run"
    run.mkdir()
    records = [{"kind": "config", "step": 0, "config": {"name": "p", "env": {"id": "atari:Pong"},
                                                          "agent": {"algo": "r2d2"}, "seed": 0}},
               {"kind": "commit", "step": 100, "episodes": 2, "return_sum": -41.0},
               {"kind": "eval", "step": 100, "mean": -20.0, "std": 0.0, "version": 1},
               {"kind": "eval", "step": 100, "mean": -21.0, "std": 0.0, "version": 1},   # again, after a resume
               {"kind": "commit", "step": 200, "episodes": 1, "return_sum": -19.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))   # no summary.json yet
    out = tmp_path / "curve.png"
    assert learning_curve.main([str(run), "--window", "100", "--out", str(out), "--json", str(tmp_path / "c.json")]) == 0
    text = capsys.readouterr().out
    stored = json.loads((tmp_path / "c.json").read_text())
    assert stored["training"] == [{"env_steps": 100, "episodes": 2, "mean_return": -20.5},
                                  {"env_steps": 200, "episodes": 1, "mean_return": -19.0}]
    assert [e["mean"] for e in stored["evals"]] == [-21.0] and stored["config"]["name"] == "p"
    assert "| 100 | 2 | -20.50 | 100: -21.0 +- 0.0 |" in text and "| 200 | 1 | -19.00 | - |" in text
    assert out.stat().st_size > 0
    # Several runs (seeds of one config): a table each, one figure, {"runs": [...]} in the same order.
    other = tmp_path / "other"
    other.mkdir()
    records[0]["config"]["seed"] = 1
    (other / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:3]))
    both = tmp_path / "both.json"
    assert learning_curve.main([str(run), str(other), "--window", "100", "--out", str(out), "--json", str(both)]) == 0
    text = capsys.readouterr().out
    stored = json.loads(both.read_text())["runs"]
    assert [r["run_dir"] for r in stored] == [str(run), str(other)] and [r["config"]["seed"] for r in stored] == [0, 1]
    assert stored[1]["training"] == [{"env_steps": 100, "episodes": 2, "mean_return": -20.5}]
    assert f"{other} (seed 1)" in text and text.count("| 100 | 2 | -20.50 |") == 2
    assert learning_curve.main([str(tmp_path / "missing")]) == 2
    assert learning_curve.main([str(run), str(tmp_path / "missing")]) == 2
    assert learning_curve.main([str(run), "--window", "0"]) == 2
    assert "valid: > 0" in capsys.readouterr().err
