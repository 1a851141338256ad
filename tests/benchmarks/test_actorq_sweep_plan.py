"""benchmarks/studies/actorq_sweep_plan.py: the N-worker projection on fixed numbers (exact values)."""
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:   # benchmarks/ is not an installed package
    sys.path.insert(0, ROOT)

from benchmarks.studies import actorq_sweep_plan as plan  # noqa: E402

CARTPOLE, MOUNTAINCAR = "configs/actorq/cartpole-dqn.yaml", "configs/actorq/mountaincar-dqn.yaml"


def test_plan_row_exact():
    assert plan.plan_row(1800.0, 10, (1, 8, 32, 100)) == {
        "per_run_h": 0.5, "runs": 10, "wall_h": {1: 5.0, 8: 1.0, 32: 0.5, 100: 0.5}, "vcpu_h": 10.0}


def test_one_sweep_hands_out_longest_first():
    assert plan.one_sweep_wall_s([2, 3, 2, 3, 2], 2) == 7     # 3|3, then 2 -> 5|3, 2 -> 5|5, 2 -> 7|5
    assert plan.one_sweep_wall_s([5, 1, 1], 8) == 5


def test_only_the_shipped_config_counts():
    base = f"-m pipelines.train --config {CARTPOLE} --seed 1 --run-dir /r --no-progress --set actors.precision=fp32"
    assert plan.shipped_run(base + " --set total_env_steps=100000 --set carbon.backend=process-time", CARTPOLE,
                            100_000)
    assert not plan.shipped_run(base + " --set total_env_steps=200000", CARTPOLE, 100_000)     # another budget
    assert not plan.shipped_run(base + " --set learner.replay_ratio=0.125", CARTPOLE, 100_000)  # the ratio sweep
    assert not plan.shipped_run(base, MOUNTAINCAR, 200_000)


def _records(root):
    """cartpole-dqn as shipped: fp32 1,000 s and int8-dynamic 1,400 s, 10,000 learner steps each; runs that do
    not count: int8-full, a replay-ratio override, a failed run."""
    runs = [("a", "fp32", "", 1000.0, 0), ("b", "int8-dynamic", "", 1400.0, 0), ("c", "int8-full", "", 9999.0, 0),
            ("d", "fp32", " --set learner.replay_ratio=0.125", 9999.0, 0), ("e", "fp32", "", 9999.0, 1)]
    for name, precision, extra, seconds, rc in runs:
        os.makedirs(root / name)
        cmd = (f"-m pipelines.train --config {CARTPOLE} --seed 0 --run-dir /r/{name} --no-progress "
               f"--set actors.precision={precision} --set total_env_steps=100000{extra}")
        (root / name / "record.json").write_text(json.dumps({
            "cmd": cmd, "rc": rc, "precision": precision, "seed": 0, "seconds": seconds,
            "date": "2026-12-02T08:00:00+00:00", "commit": "0cb5db0654a3"}))
        (root / name / "summary.json").write_text(json.dumps({"learner_steps": 10_000}))
    return str(root)


def test_measured_median_estimate_table_and_one_sweep_exact(tmp_path):
    rows = plan.collect([CARTPOLE, MOUNTAINCAR], list(plan.read_runs(_records(tmp_path))))
    assert (rows[0]["source"], rows[0]["seconds"], rows[0]["per_run_s"]) == ("measured", [1000.0, 1400.0], 1200.0)
    # mountaincar-dqn: 200,000 env steps x replay ratio 0.25 learner steps x median(0.1, 0.14) s per learner step
    assert (rows[1]["source"], rows[1]["learner_steps"], rows[1]["low"]) == ("est.", 50_000, False)
    assert abs(rows[1]["per_run_s"] - 6000.0) < 1e-9
    assert plan.markdown(rows, 5, plan.PRECISIONS, (1, 8)).splitlines() == [
        "| config | per-run h | from | runs (5 seeds x 2) | wall h, N=1 | wall h, N=8 | vCPU-h (2/worker) |",
        "|---|---|---|---|---|---|---|",
        "| cartpole-dqn | 0.33 | measured: median of 2 (0.28-0.39 h) | 10 | 3.33 | 0.67 | 6.7 |",
        "| mountaincar-dqn | 1.67 | est.: 50,000 learner steps x 120 ms (DQN runs' whole-run rate) | 10 | 16.67 | "
        "3.33 | 33.3 |",
        # 10 x 6,000 s + 10 x 1,200 s on 8 workers: two workers run 2 x 6,000 s
        "| **all 2, one sweep** | - | longest run first | 20 | 20.00 | 3.33 | 40.0 |"]


def test_main_prints_the_table_and_refuses_missing_records(tmp_path, capsys):
    records = _records(tmp_path / "runs")
    assert plan.main(["--records", records, "--configs", CARTPOLE, "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "| cartpole-dqn | 0.33 | measured: median of 2 (0.28-0.39 h) | 10 | 3.33 | 6.7 |" in out
    assert "A projection, not a measurement. Measured: 2 runs of 1 configs (2026-12-02, commits 0cb5db0;" in out
    assert plan.main(["--records", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --records") and len(err.splitlines()) == 1


def test_the_archived_study_runs_give_the_measured_rows():
    """The committed archive (read in place): 6 runs of each measured config, fp32 and int8-dynamic, seeds 0-2."""
    configs = [CARTPOLE, "configs/actorq/pendulum-d4pg.yaml", "configs/actorq/dmc-cartpole-balance-d4pg.yaml"]
    rows = plan.collect(configs + [MOUNTAINCAR], list(plan.read_runs(plan.RECORDS)))
    assert [(r["source"], len(r["seconds"]), round(r["per_run_s"], 1)) for r in rows] == [
        ("measured", 6, 1207.4), ("measured", 6, 163.2), ("measured", 6, 210.0), ("est.", 0, 3894.0)]
    assert rows[3]["learner_steps"] == 50_000 and rows[3]["rate_runs"] == 6     # cartpole-dqn's 6 runs set the rate
