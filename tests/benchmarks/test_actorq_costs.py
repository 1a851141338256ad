"""The ActorQ cost model (benchmarks/studies/actorq_model.py), its CLIs' bad input, and the wall split.

Measuring is a benchmark (not run here); these tests check the model's exact
arithmetic (steady bounds, the block pipeline, contention), the validation's
structure check, the paired-ratio report, the one-line errors, and the
``wall_split`` of ``summary.json`` on synthetic records and on one short real
run. Budget: ~20 s (the real run).
"""
from __future__ import annotations

import json

import pytest

from benchmarks.studies import actorq_costs as ac


def _costs(rollout_fp32=1e-3, rollout_int8=2.5e-4, learn=0.1):
    def prec(rollout, patch):
        return {"version": {"convert_s": 2.0, "convert_cpu_s": 2.0, "patch_s": patch, "patch_cpu_s": patch,
                            "load_s": 0.01, "load_cpu_s": 0.01, "bcast_s": 0.05, "bcast_cpu_s": 0.05,
                            "bytes": 1},
                "inference": {}, "rollout": {"wall_s": rollout, "cpu_s": rollout, "inference_wall_s": 0.0}}
    return {"env": {"wall_s": 1e-5, "cpu_s": 1e-5},
            "precisions": {"fp32": prec(rollout_fp32, 0.1), "int8-full": prec(rollout_int8, None)},
            "storage": {"write_s": 1e-4, "write_cpu_s": 1e-4, "commit_s": 1e-5, "commit_cpu_s": 1e-5, "rows": 1},
            "learner": {"wall_s": learn, "cpu_s": learn, "batch_size": 64, "steps_per_call": 16}}


SETTING = {"replay_ratio": 0.25, "num_actors": 4, "num_envs": 8, "broadcast_period": 250, "workers": 2,
           "cores": 2, "budget_env_steps": 100_000, "executor": "dask"}


def test_learner_bound_setting_predicts_no_int8_speedup():
    pred = ac.predict(_costs(), SETTING)
    # X_learner = 1 / (r * t_learn + t_commit + (r / P) * (t_patch + t_bcast)); int8-full converts
    learner = {"fp32": 1 / (0.25 * 0.1 + 1e-5 + (0.25 / 250) * (0.1 + 0.05)),
               "int8-full": 1 / (0.25 * 0.1 + 1e-5 + (0.25 / 250) * (2.0 + 0.05))}
    for p in ("fp32", "int8-full"):
        assert pred[p]["bound"] == "learner"
        assert pred[p]["env_steps_per_s"] == pytest.approx(learner[p])
        assert pred[p]["time_s"] == pytest.approx(100_000 / learner[p])
    assert pred["fp32"]["bounds"]["actors"] == pytest.approx(2 / (1e-3 + 1e-4))
    assert pred["int8-full"]["speedup_vs_fp32"] == pytest.approx(learner["int8-full"] / learner["fp32"])


def test_actor_bound_setting_predicts_the_amdahl_speedup():
    s = dict(SETTING, replay_ratio=0.0001, cores=64, workers=64, num_actors=4)
    pred = ac.predict(_costs(), s, env_steps=50_000)
    # Actors bind: X = N / (A_p + S); 4 actors on 4 of the 64 workers.
    fp32, int8 = 4 / (1e-3 + 1e-4), 4 / (2.5e-4 + 1e-4)
    assert pred["fp32"]["bound"] == pred["int8-full"]["bound"] == "actors"
    assert pred["fp32"]["env_steps_per_s"] == pytest.approx(fp32)
    assert pred["int8-full"]["speedup_vs_fp32"] == pytest.approx(int8 / fp32)
    assert pred["int8-full"]["time_s"] == pytest.approx(50_000 / int8)


def test_cpu_bound_setting_charges_version_work():
    s = dict(SETTING, replay_ratio=0.001, num_actors=64, workers=64, cores=2)
    pred = ac.predict(_costs(), s)
    # CPU per env step: rollout + write + commit + r * learn + (r / P) * (t_q + N * load + bcast)
    q_fp32 = (0.001 / 250) * (0.1 + 64 * 0.01 + 0.05)      # patchable: patch
    q_int8 = (0.001 / 250) * (2.0 + 64 * 0.01 + 0.05)      # int8-full: convert
    cpu_fp32 = 2 / (1e-3 + 1e-4 + 1e-5 + 0.001 * 0.1 + q_fp32)
    cpu_int8 = 2 / (2.5e-4 + 1e-4 + 1e-5 + 0.001 * 0.1 + q_int8)
    assert pred["fp32"]["bound"] == "cpu" and pred["fp32"]["env_steps_per_s"] == pytest.approx(cpu_fp32)
    assert pred["int8-full"]["env_steps_per_s"] == pytest.approx(cpu_int8)
    assert pred["int8-full"]["version_s"] == 2.0 and pred["fp32"]["version_s"] == 0.1


def test_predict_only_cli_and_its_errors(tmp_path, capsys):
    good = tmp_path / "costs.json"
    good.write_text(json.dumps({"schema": ac.SCHEMA, "costs": _costs()}))
    out = tmp_path / "pred.json"
    assert ac.main(["--predict", str(good), "--cores", "2", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["setting"]["replay_ratio"] == 0.25 and record["prediction"]["fp32"]["bound"] == "learner"
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    cases = [(["--predict", str(bad)], f"error: --predict {str(bad)!r} is not JSON"),
             (["--predict", str(tmp_path / "none.json")], f"error: No such file or directory: {tmp_path / 'none.json'}"),
             (["--predict", str(good), "--set", "learner.replay_ratio=-1"], "error: "),
             (["--precisions", "int4"], "error: unknown precision 'int4'; valid: fp32, fp16, int8-dynamic, int8-full")]
    for argv, start in cases:
        capsys.readouterr()
        assert ac.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(start) and err.count("\n") == 1, (argv, err)


def _records(**sched):
    return [{"kind": "config"},
            {"kind": "commit", "write_s": 0.5}, {"kind": "commit", "write_s": 1.5}, {"kind": "commit"},
            {"kind": "workers", "workers": {"w0": {"env_steps": 1000, "env_steps_per_s": 100.0},
                                            "w1": {"env_steps": 3000, "env_steps_per_s": 100.0}}},
            {"kind": "schedule", **sched}]


def test_wall_split_partitions_wall_time_exactly():
    from pipelines.run.summary import SPLIT_PARTS, wall_split
    busy = {"submit": 2.0, "commit": 3.0, "log_commit": 1.0, "cache_refresh": 1.0, "learn": 60.0,
            "learn_stage": 50.0, "end_block": 9.0, "new_version": 4.0, "checkpoint": 1.0}
    split = wall_split(_records(busy_s=busy, idle_s={"shard": 16.0, "evaluation": 2.0, "other": 1.0}), 100.0)
    # a = (10 + 30) s of tasks / 2 workers = 20; w = 0.5 + 1.5 = 2; wait = 16 + 2 = 18
    sec = split["seconds"]
    assert sec["actors"] == pytest.approx(18 * 20 / 22)
    assert sec["storage"] == pytest.approx(3.0 + 18 * 2 / 22)
    assert (sec["learner"], sec["broadcast"], sec["checkpoint"]) == (50.0, 4.0, 1.0)
    assert sec["evaluation"] == pytest.approx(2.0 + 9.0 - 4.0 - 1.0)
    assert sec["other"] == pytest.approx(100.0 - 50 - (18 + 3) - 4 - 6 - 1)   # wait + commit = 21
    assert sum(sec.values()) == pytest.approx(100.0) and list(sec) == list(SPLIT_PARTS)
    assert split["share"]["learner"] == pytest.approx(0.5)
    assert split["busy_s"] == {"actor_tasks": 40.0, "shard_writes": 2.0, "learner": 50.0}
    assert split["actor_workers"] == 2


def test_wall_split_counts_the_learners_cache_refresh_as_storage():
    from pipelines.run.summary import wall_split
    sched = dict(busy_s={"commit": 3.0, "learn": 60.0}, idle_s={"shard": 16.0},
                 stage_s={"learn_stage": 50.0, "refresh_cache": 5.0})
    before = wall_split(_records(busy_s=sched["busy_s"], idle_s=sched["idle_s"],
                                 stage_s={"learn_stage": 50.0}), 100.0)["seconds"]
    after = wall_split(_records(**sched), 100.0)["seconds"]
    assert after["storage"] == pytest.approx(before["storage"] + 5.0)
    assert after["other"] == pytest.approx(before["other"] - 5.0) and after["learner"] == 50.0


def test_wall_split_counts_only_the_last_segment_and_needs_a_schedule():
    from pipelines.run.summary import wall_split
    assert wall_split([{"kind": "config"}, {"kind": "commit", "write_s": 1.0}], 10.0) is None
    old = _records(busy_s={"learn_stage": 99.0}, idle_s={})
    new = [{"kind": "config"}, {"kind": "commit", "write_s": 1.0},
           {"kind": "schedule", "busy_s": {"learn_stage": 3.0}, "idle_s": {"shard": 4.0}}]
    split = wall_split(old + new, 10.0)
    # no workers record in this segment: the whole wait is the write's
    assert split["seconds"]["learner"] == 3.0 and split["seconds"]["storage"] == 4.0
    assert split["seconds"]["actors"] == 0.0 and split["busy_s"]["shard_writes"] == 1.0


def _pipeline_costs():
    c = {"version": {"convert_s": 2.0, "convert_cpu_s": 2.0, "patch_s": 0.3, "patch_cpu_s": 0.3,
                     "load_s": 0.0, "load_cpu_s": 0.0, "bcast_s": 0.2, "bcast_cpu_s": 0.2, "bytes": 1},
         "inference": {}, "rollout": {"wall_s": 0.01, "cpu_s": 0.01, "inference_wall_s": 0.0}}
    storage = {"write_s": 0.0, "write_cpu_s": 0.0, "commit_s": 0.0, "commit_cpu_s": 0.0,
               "write_shard_s": 0.1, "commit_shard_s": 0.05}
    learner = {"wall_s": 0.2, "cpu_s": 0.2, "trace_s": 1.0, "retrace_s": 0.5}
    s = {"replay_ratio": 0.1, "num_actors": 2, "workers": 2, "cores": 64, "broadcast_period": 5,
         "block_rows": 100, "policy_lag": 1, "min_size": 100, "steps_per_call": 4, "learner_threads": 1}
    return c, storage, learner, s


def test_simulate_plays_the_block_pipeline_exactly():
    from benchmarks.studies.actorq_model import simulate
    c, storage, learner, s = _pipeline_costs()
    run = simulate(c, storage, learner, s, 300)
    # block 0: rollouts 0.5, write 0.1, commit 0.05, 10 steps [4, 4, 2] = 2.0 + both traces 1.5, version 0.5
    #          -> 4.65; block 1: rollouts ran ahead (lag 1), commit at 4.7, + 2.0 + 0.5 -> 7.2;
    # block 2: its rollouts wait for learner block 0's version (4.65) -> 5.15, commit 7.25, -> 9.75
    assert run["time_s"] == pytest.approx(9.75)
    assert run["env_steps_per_s"] == pytest.approx(300 / 9.75)
    assert (run["blocks"], run["learner_steps"], run["versions"]) == (3, 30, 3)
    assert run["share"]["actors"] == pytest.approx(0.5 / 9.75)
    assert run["share"]["storage"] == pytest.approx(0.25 / 9.75)
    assert run["share"]["learner"] == pytest.approx(7.5 / 9.75)
    assert run["share"]["broadcast"] == pytest.approx(1.5 / 9.75)
    assert run["bound"] == "learner" and run["slowdown"] == 1.0
    # A block's Dask round trip (0.1 s) delays each shard's arrival at the driver; only block 0's
    # is on this learner-bound run's critical path: 9.75 + 0.1.
    slow = simulate(c, dict(storage, dispatch_s=0.1), learner, s, 300)
    assert slow["time_s"] == pytest.approx(9.85)
    # Of that round trip, the driver thread's own submit calls and result fetch (0.03 + 0.02) are
    # serial with its learner: every block's commit waits 0.05 more, the shard's arrival 0.05 less.
    # block 0: write at 0.5 + 0.1 + 0.05, commit 0.65 + 0.05 + 0.05 -> learn_end 4.75; block 1:
    # 4.85 -> 7.35; block 2: 7.45 -> 9.95.
    driver = simulate(c, dict(storage, dispatch_s=0.1, driver_submit_s=0.03, driver_gather_s=0.02), learner, s,
                      300)
    assert driver["time_s"] == pytest.approx(9.95)
    assert driver["share"]["driver"] == pytest.approx(0.15 / 9.95)
    # Where the round trip's own submits were measured (0.01 s for its empty graph), those leave the round
    # trip, not the block's real submits: each shard arrives 0.02 later than above (0.1 - 0.01 - 0.02 = 0.07
    # of scheduling and hand-offs instead of 0.05), and as with the round trip itself only block 0's arrival
    # is on this learner-bound run's critical path: 9.95 + 0.02.
    measured = simulate(c, dict(storage, dispatch_s=0.1, dispatch_submit_s=0.01, driver_submit_s=0.03,
                                driver_gather_s=0.02), learner, s, 300)
    assert measured["time_s"] == pytest.approx(9.97)
    # A fresh worker's first shard write pays its imports (0.6 s instead of 0.1): blocks 0 and 1 write on the
    # 2 workers' first writes, and only block 0's is on the critical path (block 1's shard arrives at 1.6,
    # long before learner block 0 ends): block 0 commits at 1.15 -> 5.15, block 1 -> 7.7, block 2 -> 10.25.
    first = simulate(c, dict(storage, first_write_shard_s=0.6), learner, s, 300)
    assert first["time_s"] == pytest.approx(10.25)
    # One worker: block 0 alone writes first (its rollouts take 1.0 s there): 10.25 + 0.5.
    assert simulate(c, storage, learner, dict(s, workers=1), 300)["time_s"] == pytest.approx(10.25)
    one_worker = simulate(c, dict(storage, first_write_shard_s=0.6), learner, dict(s, workers=1), 300)
    assert one_worker["time_s"] == pytest.approx(10.75)


def test_contention_from_wall_over_cpu_and_its_slowdown():
    from benchmarks.studies.actorq_model import contention, simulate
    c, storage, learner, s = _pipeline_costs()
    assert contention(c, learner, 2) == 0.0       # wall == CPU: nobody else runs
    slow = dict(c, rollout={"wall_s": 0.02, "cpu_s": 0.01, "inference_wall_s": 0.0})
    slow_learner = dict(learner, wall_s=0.4, cpu_s=0.2)
    # sigma = 0.42 / 0.21 = 2 = (M + 1) / C on C = 2 cores: M = 3 other runnable threads
    assert contention(slow, slow_learner, 2) == pytest.approx(3.0)
    run = simulate(slow, storage, slow_learner, dict(s, cores=2), 300)
    # our 2 actors + learner beside 3 others: (3 + 2 u_a + u_l) / 2 over the measured (3 + 1) / 2
    u = run["utilization"]
    assert run["slowdown"] == pytest.approx((3 + 2 * u["actors"] + u["learner"]) / 2 / 2.0)
    assert 1.0 < run["slowdown"] < 1.5


def test_co_run_costs_replace_the_cpu_share_for_our_own_threads():
    from benchmarks.studies.actorq_model import _pipeline, simulate
    c, storage, learner, s = _pipeline_costs()
    co = dict(c, corun={"learner_wall_s": 0.5, "rollout_wall_s": 0.03, "learner_steps": 9})
    # One round: both sides assumed always busy, so each step costs its co-run time exactly
    # (traces scale with the learner: 0.5 / 0.2); no other users (wall == CPU at measuring time).
    one = simulate(co, storage, learner, dict(s, cores=2), 300, iterations=1)
    # The driver thread's commit and cache refresh slow down with the learner's (x 2.5).
    by_hand = _pipeline(0.03, 0.5, (1.0 * 2.5, 0.5 * 2.5), co, storage, dict(s, cores=2), 300, driver_scale=2.5)
    assert one["time_s"] == pytest.approx(by_hand["time_s"]) and one["slowdown"] == 1.0
    # Converged: t = t_alone + o * (t_corun - t_alone), o: the share of this side's busy time the
    # pipeline overlaps with the other side's.
    run = simulate(co, storage, learner, dict(s, cores=2), 300)
    o = run["overlap"]
    assert 0.0 < o["learner"] < 1.0 and 0.0 < o["actors"] <= 1.0
    l_step, a_step = 0.2 + o["learner"] * 0.3, 0.01 + o["actors"] * 0.02
    again = _pipeline(a_step, l_step, (l_step / 0.2, 0.5 * l_step / 0.2), co, storage, dict(s, cores=2), 300,
                      driver_scale=l_step / 0.2)
    assert run["time_s"] == pytest.approx(again["time_s"], rel=1e-3)
    assert simulate(c, storage, learner, dict(s, cores=2), 300)["time_s"] < run["time_s"]
    # Fetching the write's result from workers busy with rollouts (0.05 s; 0.01 from idle ones) costs
    # the driver's thread the difference per block, as often as the actors are busy beside the learner.
    busy = dict(co, corun=dict(co["corun"], gather_wall_s=0.05))
    sto = dict(storage, dispatch_s=0.02, driver_submit_s=0.0, driver_gather_s=0.01)
    fetched = simulate(busy, sto, learner, dict(s, cores=2), 300)
    o = fetched["overlap"]
    l_step, a_step = 0.2 + o["learner"] * 0.3, 0.01 + o["actors"] * 0.02
    again = _pipeline(a_step, l_step, (l_step / 0.2, 0.5 * l_step / 0.2), busy, sto, dict(s, cores=2), 300,
                      driver_scale=l_step / 0.2, gather_extra=o["actors"] * 0.04)
    assert fetched["time_s"] == pytest.approx(again["time_s"], rel=1e-3)
    # with the step times fixed, the slower fetch delays every block's commit: all 3 are on this
    # learner-bound run's critical path
    unfetched = _pipeline(a_step, l_step, (l_step / 0.2, 0.5 * l_step / 0.2), busy, sto, dict(s, cores=2), 300,
                          driver_scale=l_step / 0.2)
    assert again["time_s"] == pytest.approx(unfetched["time_s"] + 3 * o["actors"] * 0.04)
    # A co-run that measured no learner step (rollouts too short) falls back to the CPU share.
    none = dict(c, corun={"learner_wall_s": None, "rollout_wall_s": 0.03, "learner_steps": 0})
    assert simulate(none, storage, learner, s, 300)["time_s"] == simulate(c, storage, learner, s, 300)["time_s"]


def test_the_learner_overlaps_the_workers_through_rollouts_and_shard_writes():
    from benchmarks.studies.actorq_model import _pipeline
    c, storage, learner, s = _pipeline_costs()
    run = _pipeline(0.01, 0.2, (1.0, 0.5), c, storage, s, 200)
    # workers busy: block 0 rollouts 0-0.5 + write to 0.6, block 1 rollouts 0.5-1.0 + write to 1.1 -> (0, 1.1);
    # learner: block 0 at commit 0.65 for 2.0 + 1.5 traces -> (0.65, 4.15), block 1 (4.7, 6.7): 0.45 together
    assert run["time_s"] == pytest.approx(7.2)
    assert run["overlap"]["learner"] == pytest.approx(0.45 / 5.5)
    assert run["overlap"]["actors"] == pytest.approx(0.45 / 1.0)


def test_parallel_rollouts_count_the_gaps_between_chained_tasks():
    from benchmarks.studies.actorq_model import simulate
    c, storage, learner, s = _pipeline_costs()
    in_tasks = dict(c, rollout_parallel={"wall_s": 0.01, "workers": 2})
    chained = dict(c, rollout_parallel={"wall_s": 0.01, "chain_wall_s": 0.03, "workers": 2})
    as_chained = dict(c, rollout_parallel={"wall_s": 0.03, "workers": 2})
    t = simulate(chained, storage, learner, s, 300)["time_s"]
    assert t == simulate(as_chained, storage, learner, s, 300)["time_s"] > simulate(in_tasks, storage, learner, s,
                                                                                     300)["time_s"]


def test_overlap_of_two_interval_lists_exact():
    from benchmarks.studies.actorq_model import _overlap
    rolls = [(0.0, 1.0), (1.0, 2.0), (4.0, 6.0)]
    learns = [(0.5, 1.5), (3.0, 4.5), (5.5, 7.0)]
    assert _overlap(rolls, learns) == pytest.approx(0.5 + 0.5 + 0.5 + 0.5)
    assert _overlap(rolls, []) == 0.0 and _overlap([(0.0, 1.0)], [(1.0, 2.0)]) == 0.0


def test_projection_limits():
    import numpy as np
    from benchmarks.studies.actorq_projection import amdahl, pipelined
    f = np.array([0.0, 0.5, 0.75, 1.0])
    assert amdahl(f, 4.0) == pytest.approx([1.0, 1 / (0.5 + 0.125), 1 / (0.25 + 0.1875), 4.0])
    # overlapped: no gain until actors are the slower side; then max(f, 1-f) / max(f/s, 1-f)
    assert pipelined(f, 4.0) == pytest.approx([1.0, 1.0, 0.75 / 0.25, 4.0])


def test_validation_feeds_the_model_the_runs_own_stage_costs(capsys):
    from benchmarks.studies import actorq_validate as av
    c, storage, learner, s = _pipeline_costs()
    row = {"precision": "fp32", "env_steps": 300, "learner_steps": 30,
           "costs": {"precisions": {"fp32": dict(c, rollout_parallel={"wall_s": 9.0, "workers": 2})},
                     "storage": storage, "learner": learner},
           "predicted": {"run": {"blocks": 3}}, "setting": s,
           "wall_split": {"busy_s": {"actor_tasks": 3.0, "shard_writes": 0.3, "learner": 6.0}}}
    rc = av.run_costs(row)
    assert rc["precisions"]["fp32"]["rollout"]["wall_s"] == 0.01           # 3 s of tasks / 300 env steps
    assert "rollout_parallel" not in rc["precisions"]["fp32"]
    assert rc["storage"]["write_shard_s"] == pytest.approx(0.1)            # 0.3 s / 3 blocks
    assert rc["learner"] == {"wall_s": 0.2, "cpu_s": 0.0, "trace_s": 0.0, "retrace_s": 0.0}
    # The pipeline of test_simulate_... without traces (1.5 s less on the critical path).
    assert av.structure_check(row) == pytest.approx(300 / (9.75 - 1.5))
    assert av.main(["--only", "99", "--out", "x.json"]) == 2
    assert capsys.readouterr().err.startswith("error: --only 99 is out of range; valid: 0..")
    # --scale lengthens every run by K and leaves the regime's other overrides alone.
    assert av.scaled(["learner.replay_ratio=0.002", "total_env_steps=16384", "env.num_envs=1"], 4) == \
        ["learner.replay_ratio=0.002", "total_env_steps=65536", "env.num_envs=1"]
    assert av.main(["--scale", "0", "--out", "x.json"]) == 2
    assert capsys.readouterr().err.strip() == "error: --scale 0 must be a positive integer"


def test_simulate_takes_the_runs_own_contention():
    from benchmarks.studies.actorq_model import simulate
    c, storage, learner, s = _pipeline_costs()
    s = dict(s, cores=2)
    # costs measured on an idle machine (wall == CPU); 3 other threads during the run
    run = simulate(c, storage, learner, s, 300, others=3.0)
    u = run["utilization"]
    assert run["contention_others"] == 3.0
    assert run["slowdown"] == pytest.approx((3 + 2 * u["actors"] + u["learner"]) / 2)
    assert run["time_s"] > simulate(c, storage, learner, s, 300)["time_s"]


def test_paired_ratios_per_seed_with_spread():
    from core.report.actorq import paired_ratios, spread_table
    from core.report.runs import Run

    def run(p, seed, sps, kwh, final, learner=None):
        summary = {"env_steps_per_s": sps, "energy_kwh": kwh, "co2e_kg": kwh / 2, "time_to_target_s": None,
                   "final_eval": {"fp32": {"mean": final}, p: {"mean": final}},
                   "wall_split": {"share": {"learner": learner}}}
        cfg = {"env": {"id": "CartPole-v1"}, "agent": {"algo": "dqn"}, "actors": {"precision": p}, "seed": seed,
               "eval": {"target_return": 475}}
        return Run(f"r-{p}-{seed}", cfg, summary, [])
    runs = [run("fp32", 0, 100.0, 1.0, 200.0, 0.8), run("fp32", 1, 50.0, 2.0, 100.0, 0.6),
            run("int8-full", 0, 110.0, 0.5, 100.0), run("int8-full", 1, 40.0, 2.0, 150.0)]
    (row,) = paired_ratios(runs)
    assert row["pairs"] == 2 and row["time_to_target"] is None
    assert row["throughput"] == {"median": pytest.approx(0.95), "min": 0.8, "max": pytest.approx(1.1), "n": 2}
    assert row["energy"] == {"median": 1.5, "min": 1.0, "max": 2.0, "n": 2}
    assert row["final_rel"]["min"] == -0.5 and row["final_rel"]["max"] == 0.5
    assert row["learner_share"]["median"] == pytest.approx(0.7)
    assert "| 0.95x [0.80, 1.10] (n=2) |" in spread_table([row])


@pytest.mark.slow
def test_a_real_run_records_its_wall_split(tmp_path):
    """A short local run (default small config): the split is in summary.json and adds up to its wall time."""
    from core.config import load_config
    from core.metrics import read_metrics
    from pipelines.train import train
    cfg = load_config(overrides=["executor=local", "total_env_steps=1500", "replay.min_size=500",
                                 "eval.every_env_steps=100000", "checkpoint.every_steps=100000"])
    run_dir = str(tmp_path / "run")
    summary = train(cfg, run_dir, progress=False)
    with open(f"{run_dir}/summary.json") as f:
        split = json.load(f)["wall_split"]
    assert split == summary["wall_split"]
    assert sum(split["seconds"].values()) == pytest.approx(summary["wall_s"])
    sched = read_metrics(run_dir, "schedule")[-1]
    commits = read_metrics(run_dir, "commit")
    assert split["seconds"]["learner"] == sched["stage_s"]["learn_stage"] > 0
    # The in-process learner stage trains and quantizes inside the driver's "learn" phase.
    assert sched["stage_s"]["learn_stage"] + sched["stage_s"]["new_version"] <= sched["busy_s"]["learn"]
    assert split["seconds"]["broadcast"] == pytest.approx(sched["stage_s"]["new_version"]
                                                          + sched["busy_s"].get("new_version", 0.0))
    assert all(c["write_s"] > 0 for c in commits)
    assert split["busy_s"]["shard_writes"] == pytest.approx(sum(c["write_s"] for c in commits))
    # The local executor runs rollouts inside "submit": the actors' part is measured, not a remainder.
    assert split["seconds"]["actors"] > 0 and split["busy_s"]["actor_tasks"] > 0
    assert 0 <= split["seconds"]["other"] < 0.5 * summary["wall_s"]
