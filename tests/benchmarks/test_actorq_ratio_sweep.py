"""The ActorQ replay-ratio sweep: kept study runs grouped by ratio, exact per-ratio values, the model's
speedup at each ratio, and one-line errors for bad input."""
import json
import os

import pytest

from benchmarks.studies import actorq_model, actorq_ratio_sweep as sweep
from core import config as config_lib
from test_actorq_costs import _costs
from synthetic_runs import make_run as _make_run


def _kept(root, setting, precision, seed, ratio, ttt, steps_to_target, wall=100.0, busy=None, config=None):
    """A kept run of ``setting`` at ``ratio``: ``_make_run`` with the sweep's fields filled in."""
    sdir = os.path.join(root, setting)
    os.makedirs(sdir, exist_ok=True)
    d = _make_run(sdir, f"{precision}-s{seed}", precision, seed, ttt, 500.0, 0.001, 0.0005, wall=wall)
    cfg = config or {"name": "t", "seed": seed, "run_dir": None, "total_env_steps": 400_000,
                     "env": {"id": "CartPole-v1"}, "agent": {"algo": "dqn", "batch_size": 64},
                     "actors": {"precision": precision}, "eval": {"target_return": 475.0},
                     "learner": {"replay_ratio": ratio}}
    cfg = dict(cfg, seed=seed, actors=dict(cfg["actors"], precision=precision))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(d, "summary.json")) as f:
        summary = json.load(f)
    summary["env_steps_to_target"] = steps_to_target
    summary["wall_split"] = {"share": {"learner": 0.9, "actors": 0.01}, "busy_s": {"actor_tasks": busy or 10.0},
                             "actor_workers": 2, "wall_s": wall}
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(summary, f)
    return d


def test_rows_per_ratio_are_exact_and_count_unsolved_seeds(tmp_path):
    keep = str(tmp_path)
    _kept(keep, "cartpole-dqn-actorq-100000", "fp32", 0, 0.25, 1000.0, 60_000)
    _kept(keep, "cartpole-dqn-actorq-100000", "fp32", 1, 0.25, 1200.0, 64_000, busy=20.0)
    _kept(keep, "cartpole-dqn-actorq-100000", "int8-dynamic", 0, 0.25, 800.0, 60_000)
    _kept(keep, "cartpole-dqn-actorq-100000", "int8-dynamic", 1, 0.25, 1500.0, 64_000)
    _kept(keep, "cartpole-dqn-actorq-400000--learner.replay_ratio=0.0625", "fp32", 0, 0.0625, 900.0, 184_320)
    _kept(keep, "cartpole-dqn-actorq-400000--learner.replay_ratio=0.0625", "fp32", 1, 0.0625, None, None)
    _kept(keep, "cartpole-dqn-actor-bound-100000", "fp32", 0, 0.03, None, None)   # another size: not read
    rows = sweep.sweep_rows(sweep.load_points(keep, "cartpole-dqn", "actorq"))
    assert [r["replay_ratio"] for r in rows] == [0.25, 0.0625]
    high, low = rows
    assert (high["reached"], high["runs"], high["samples_per_insert"]) == (2, 2, 16.0)
    assert high["env_steps_to_target"] == {"median": 62_000.0, "min": 60_000.0, "max": 64_000.0, "n": 2}
    assert high["learner_steps_to_target"] == {"median": 15_500.0, "min": 15_000.0, "max": 16_000.0, "n": 2}
    assert high["time_to_target_s"]["median"] == 1100.0
    assert high["actor_workers_busy"] == {"median": pytest.approx(0.075), "min": 0.05, "max": 0.1, "n": 2}  # 10|20 / 200
    # per seed pair: fp32 / int8 time to target = 1000/800 and 1200/1500
    assert high["measured_time_ratio"] == {"median": pytest.approx((1.25 + 0.8) / 2), "min": 0.8, "max": 1.25,
                                           "n": 2}
    assert (low["reached"], low["runs"]) == (1, 2)                   # the unsolved seed still counts as a run
    assert low["learner_steps_to_target"] == {"median": 11_520.0, "min": 11_520.0, "max": 11_520.0, "n": 1}
    assert low["measured_time_ratio"] is None and low["predicted_speedup"] is None
    table = sweep.markdown(rows, 475.0)
    assert "| 0.25 | 16 | 2/2 (budget 400,000) | 62,000 [60,000, 64,000] | 15,500 [15,000, 16,000] |" in table
    assert "| 0.0625 | 4 | 1/2 (budget 400,000) | 184,320 | 11,520 |" in table


def test_the_predicted_speedup_is_the_model_played_out_to_the_median_env_steps(tmp_path):
    cfg = config_lib.to_dict(config_lib.load_config("configs/actorq/cartpole-dqn.yaml",
                                                    ["learner.replay_ratio=0.0625"]))
    for seed, steps in ((0, 180_000), (1, 190_000), (2, 200_000)):
        _kept(str(tmp_path), "cartpole-dqn-actorq-400000--x", "fp32", seed, 0.0625, 900.0, steps, config=cfg)
    costs = _costs()
    rows = sweep.sweep_rows(sweep.load_points(str(tmp_path), "cartpole-dqn", "actorq"), costs, "int8-full", 2)
    expected = actorq_model.predict(costs, actorq_model.setting(config_lib.from_dict(cfg), 2), 190_000)
    assert rows[0]["predicted_speedup"] == pytest.approx(expected["int8-full"]["run"]["speedup_vs_fp32"])
    assert rows[0]["predicted_speedup"] > 0
    with pytest.raises(sweep.SweepError, match="no 'int8-dynamic' or no fp32 costs"):
        sweep.sweep_rows(sweep.load_points(str(tmp_path), "cartpole-dqn", "actorq"), costs, "int8-dynamic", 2)


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert sweep.main(["--keep", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert sweep.main(["--keep", str(tmp_path)]) == 2
    assert "no kept runs of 'cartpole-dqn'" in capsys.readouterr().err
    bad = tmp_path / "costs.json"
    bad.write_text("{}")
    assert sweep.main(["--keep", str(tmp_path), "--costs", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "is not a benchmarks.studies.actorq_costs --out file" in err and err.count("\n") == 1


def test_the_cli_writes_table_plot_and_rows(tmp_path, capsys):
    keep = tmp_path / "kept"
    _kept(str(keep), "cartpole-dqn-actorq-100000", "fp32", 0, 0.25, 1000.0, 60_000)
    _kept(str(keep), "cartpole-dqn-actorq-200000--learner.replay_ratio=0.125", "fp32", 0, 0.125, 1100.0, 104_448)
    png, rows = tmp_path / "sweep.png", tmp_path / "sweep.json"
    assert sweep.main(["--keep", str(keep), "--out", str(png), "--json", str(rows)]) == 0
    assert "| 0.125 | 8 | 1/1" in capsys.readouterr().out
    assert png.stat().st_size > 0
    assert [r["replay_ratio"] for r in json.loads(rows.read_text())["rows"]] == [0.25, 0.125]


def test_the_runs_of_a_ratio_sweep_directory_give_the_same_rows_as_kept_runs(tmp_path, capsys):
    """--sweep reads a sweep of configs/sweeps/actorq-ratio.yml: its finished runs, grouped by their ratio."""
    from pipelines.sweeps import SweepDir, expand
    from pipelines.sweeps.spec import read_spec
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    spec = read_spec(os.path.join(repo, "configs", "sweeps", "actorq-ratio.yml"))
    runs = expand(spec)
    sdir = SweepDir(str(tmp_path / "sw"))
    sdir.create(spec, runs)
    assert sweep.main(["--sweep", sdir.root]) == 2             # nothing finished yet: one line
    assert capsys.readouterr().err.startswith(f"error: no run of the sweep in {sdir.root!r} has finished; ")
    made = {}
    for name, ratio, ttt, steps in (("cartpole-dqn-r0.25__s0", 0.25, 1000.0, 60_000),
                                    ("cartpole-dqn-r0.125__s0", 0.125, 1100.0, 104_448)):
        d = _kept(str(tmp_path / "made"), name, "fp32", 0, ratio, ttt, steps)
        os.renames(d, sdir.run_dir(name))
        made[ratio] = _kept(str(tmp_path / "kept"), f"cartpole-dqn-actorq-{int(25_000 / ratio)}", "fp32", 0, ratio,
                            ttt, steps)
    assert [r.name for r in runs if r.seed == 0] == ["cartpole-dqn-r0.25__s0", "cartpole-dqn-r0.125__s0",
                                                     "cartpole-dqn-r0.0625__s0", "cartpole-dqn-r0.03125__s0"]
    rows = tmp_path / "rows.json"
    assert sweep.main(["--sweep", sdir.root, "--json", str(rows)]) == 0
    from_sweep = json.loads(rows.read_text())["rows"]
    assert sweep.main(["--keep", str(tmp_path / "kept"), "--json", str(rows)]) == 0
    assert from_sweep == json.loads(rows.read_text())["rows"] and [r["replay_ratio"] for r in from_sweep] == [0.25, 0.125]
