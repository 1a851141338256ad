"""benchmarks/micro/beam_throughput.py: pairs alternate their order, ratios are beam / local, bad input fails."""
import sys

import pytest

from benchmarks.micro import beam_throughput


def test_pairs_alternate_and_each_ratio_is_beam_over_local(tmp_path):
    calls = []
    speeds = {"local": [1000.0, 800.0, 500.0], "beam": [600.0, 400.0, 450.0]}

    def run(executor, run_dir):
        calls.append((executor, run_dir[len(str(tmp_path)) + 1:]))
        whole = speeds[executor][sum(e == executor for e, _ in calls) - 1]
        return {"whole": whole, "loop": 2 * whole if executor == "local" else whole}

    rows = beam_throughput.measure(3, run, str(tmp_path), log=lambda line: None)
    assert calls == [("local", "p0-local"), ("beam", "p0-beam"), ("beam", "p1-beam"), ("local", "p1-local"),
                     ("local", "p2-local"), ("beam", "p2-beam")]
    assert [(r["local"], r["beam"], r["ratio"]) for r in rows] == [(1000.0, 600.0, 0.6), (800.0, 400.0, 0.5),
                                                                   (500.0, 450.0, 0.9)]
    assert [(r["local_loop"], r["beam_loop"], r["ratio_loop"]) for r in rows] == [
        (2000.0, 600.0, 0.3), (1600.0, 400.0, 0.25), (1000.0, 450.0, 0.45)]


def test_a_run_is_timed_from_process_start_to_exit_and_read_from_its_summary(tmp_path, monkeypatch):
    clock = iter([10.0, 18.0])
    monkeypatch.setattr(beam_throughput.time, "perf_counter", lambda: next(clock))

    def fake_run(cmd, **kwargs):
        run_dir = cmd[cmd.index("--run-dir") + 1]
        (tmp_path / "summary.json").write_text('{"env_steps": 16384, "env_steps_per_s": 4096.0}')
        assert run_dir == str(tmp_path)
        return beam_throughput.subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(beam_throughput.subprocess, "run", fake_run)
    assert beam_throughput.run_train("local", 16384, str(tmp_path)) == {"whole": 2048.0, "loop": 4096.0}


def test_the_train_command_is_the_cli_with_the_budget_first():
    assert beam_throughput.train_command("beam", 16384, "/tmp/r", ["actors.num_actors=2"]) == [
        sys.executable, "-m", "pipelines.train", "--executor", "beam", "--no-progress", "--run-dir", "/tmp/r",
        "--set", "total_env_steps=16384", "--set", "actors.num_actors=2"]


def test_a_failed_run_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    def fail(*a, **k):
        raise RuntimeError("local run failed (exit 2): error: bad config")
    monkeypatch.setattr(beam_throughput, "run_train", fail)
    assert beam_throughput.main(["--pairs", "1"]) == 1
    assert capsys.readouterr().err == "error: local run failed (exit 2): error: bad config\n"
    with pytest.raises(SystemExit):
        beam_throughput.main(["--pairs", "0"])
