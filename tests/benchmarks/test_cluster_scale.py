"""benchmarks/studies/cluster_scale.py: its arithmetic exactly, its bad input, and a short real run at N = 1, 2."""
import json

import pytest

from benchmarks.studies import cluster_scale as cs


def _rec(n, sps, driver, sched, block_ms=1.0):
    return {"n_workers": n, "env_steps_per_s": sps, "driver_cpu_s_per_1k_steps": driver,
            "scheduler_cpu_s_per_1k_steps": sched, "central_cpu_s_per_1k_steps": driver + sched,
            "driver_cpu_ms_per_block": block_ms}


def test_efficiency_is_steps_per_s_over_n_times_one_actor():
    records = [_rec(1, 500.0, 0.1, 0.1), _rec(2, 900.0, 0.1, 0.1), _rec(8, 3000.0, 0.1, 0.1)]
    cs.add_efficiency(records)
    assert [r["efficiency"] for r in records] == [1.0, 0.9, 0.75]
    alone = [_rec(4, 100.0, 0.1, 0.1)]
    cs.add_efficiency(alone)
    assert alone[0]["efficiency"] is None       # no N = 1 record: nothing to compare with


def test_projection_names_the_costlier_central_process_from_the_largest_n():
    records = [_rec(1, 500.0, 0.04, 0.02), _rec(64, 30000.0, 0.002, 0.005, block_ms=8.192)]
    p = cs.projection(records, 4096, None)
    assert p["one_driver_core_env_steps_per_s"] == 500_000       # 1 / (2 ms per 1,000 steps)
    assert p["one_scheduler_core_env_steps_per_s"] == 200_000
    assert p["saturates_first"] == "scheduler"
    assert p["central_cost_max_over_min"] == pytest.approx(0.06 / 0.007, abs=1e-3)
    assert (p["from_n_workers"], p["driver_ms_per_block"]) == (64, 8.192)
    assert p["central_cost_less_idle_max_over_min"] is None      # no idle floor measured


def test_the_idle_floor_is_taken_off_each_n_at_its_own_rate():
    # an idle cluster costing 10 ms/s: 0.02 s per 1k env steps at 500 steps/s, 1/3000 s at 30,000
    records = [_rec(1, 500.0, 0.04, 0.02), _rec(64, 30000.0, 0.002, 0.005)]
    p = cs.projection(records, 4096, {"scheduler_ms_per_s": 9.0, "client_ms_per_s": 1.0})
    assert p["idle_floor_cpu_s_per_1k_steps"] == [0.02, round(1 / 3000, 5)]
    assert p["central_cost_less_idle_max_over_min"] == pytest.approx(0.04 / (0.007 - 1 / 3000), abs=1e-3)


def test_auto_task_size_gives_every_actor_one_task_per_block():
    args = cs.build_parser().parse_args(["--steps-per-task", "auto"])
    assert [cs.task_steps(args, n) for n in (1, 8, 64)] == [512, 64, 8]     # 4,096 rows / (N x 8 envs)
    assert cs.task_steps(cs.build_parser().parse_args([]), 64) == 8         # the fixed default at every N


@pytest.mark.parametrize("argv, says", [(["--workers", "0"], "--workers 0"),
                                        (["--obs", "4-float64"], "--obs 4-float64"),
                                        (["--workers", "128"], "block-rows"),
                                        (["--step-us", "0"], "--step-us 0"),
                                        (["--steps-per-task", "auto", "--workers", "1", "3"],
                                         "--steps-per-task auto at N = 3"),
                                        (["--steps-per-task", "0"], "--steps-per-task 0"),
                                        (["--idle-seconds", "-1"], "--idle-seconds"),
                                        (["--steps-per-task", "auto", "--num-envs", "0"], "--num-envs 0")])
def test_bad_settings_get_one_error_line_and_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        cs.main([*argv, "--out", "", "--plot", ""])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error: ") and says in err and "\n" not in err


@pytest.mark.slow
def test_a_short_sweep_writes_one_record_per_n_with_its_efficiency(tmp_path):
    out, png = tmp_path / "scale.json", tmp_path / "scale.png"
    assert cs.main(["--workers", "1", "2", "--seconds", "1", "--block-rows", "512", "--step-us", "200",
                    "--warmup-blocks", "1", "--idle-seconds", "0.5", "--no-progress", "--out", str(out),
                    "--plot", str(png)]) == 0
    record = json.loads(out.read_text())
    assert record["env_id"] == "waiting:4-float32-200us" and record["learner"] == "simulated"
    assert record["learner_host"] == "worker"      # the default: the driver's CPU is orchestration only
    assert {"date", "command", "machine", "machine_load_end", "projection"} <= set(record)
    assert record["machine"]["cpu"] and len(record["machine"]["loadavg"]) == 3
    one, two = record["records"]
    assert (one["n_workers"], two["n_workers"]) == (1, 2)
    assert one["efficiency"] == 1.0
    assert two["efficiency"] == round(two["env_steps_per_s"] / (2 * one["env_steps_per_s"]), 4)
    for r in (one, two):
        assert r["block_rows"] == 512 and r["plan_tasks_per_block"] == 8 and r["env_steps"] % 512 == 0
        assert r["rollout_tasks"] == "per-worker" and r["tasks_per_block"] == r["worker_processes"] + 1
        assert r["env_steps_per_s"] > 0 and r["driver_cpu_s_per_1k_steps"] > 0 and r["scheduler_cpu_s_per_1k_steps"] > 0
        assert 0 < r["driver_bytes_in"] < r["trajectory_bytes"]
        assert r["commit_latency_ms_p50"] <= r["commit_latency_ms_p99"]
        assert r["policy_lag_versions_max"] >= 0
        split = r["driver_cpu_ms_per_block_by_thread"]
        assert split["main"] > 0 and split["client_io_loop"] > 0
        assert sum(split.values()) == pytest.approx(r["driver_cpu_ms_per_block"], abs=0.01)
        assert r["learner_cpu_s_per_1k_steps"] > 0 and r["learner_where"].startswith("tcp://127.0.0.1:")
    assert record["projection"]["saturates_first"] in ("driver", "scheduler")
    floor = record["projection"]["idle_floor"]
    assert floor["scheduler_ms_per_s"] >= 0 and floor["seconds"] >= 0.5     # psutil counts in 10 ms ticks
    assert record["projection"]["central_cost_less_idle_max_over_min"] >= 1.0
    assert png.stat().st_size > 0


def test_a_record_re_renders_with_the_idle_floor_and_a_bad_one_is_one_line(tmp_path, capsys):
    from benchmarks.studies import cluster_scale_plot as csp
    records = [{**_rec(n, 100.0 * n, 0.04 / n, 0.05 / n), "block_rows": 4096, "efficiency": 1.0} for n in (1, 2)]
    record = {"records": records, "env_id": "waiting:4-float32-200us", "learner": "simulated",
              "learner_host": "worker", "machine": {"cpu": "X", "cores": 2},
              "projection": {"idle_floor": {"seconds": 1.0, "scheduler_ms_per_s": 5.0, "client_ms_per_s": 1.0},
                             "idle_floor_cpu_s_per_1k_steps": [0.06, 0.03]}}
    path = tmp_path / "scale.json"
    path.write_text(json.dumps(record))
    assert csp.main([str(path), str(tmp_path / "scale.png")]) == 0
    assert (tmp_path / "scale.png").stat().st_size > 0
    assert csp.title(record) == ("cluster scale: waiting:4-float32-200us, 4096-row blocks, learner simulated on "
                                 "the worker; X, 2 cores")
    path.write_text(json.dumps({"records": []}))
    with pytest.raises(SystemExit) as e:
        csp.main([str(path), str(tmp_path / "bad.png")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"{path} is not a cluster-scale record: "
                                                                     "KeyError: 'projection'")
