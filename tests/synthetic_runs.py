"""Synthetic run directories (config.json, summary.json, metrics.jsonl) for the report tests.

Shared by tests/pipelines/test_report.py and the ActorQ study tests in tests/benchmarks/.
"""
import json
import os


def make_run(root, dirname, precision, seed, ttt, final, energy, co2e, wall=100.0, steps=10_000, **config_changes):
    d = os.path.join(root, dirname)
    os.makedirs(d)
    config = {"name": "t", "seed": seed, "run_dir": None, "total_env_steps": 10_000,
              "env": {"id": "CartPole-v1"}, "agent": {"algo": "dqn", "n_step": 3},
              "actors": {"precision": precision, "num_actors": 4}, "eval": {"target_return": 475.0}}
    for key, value in config_changes.items():
        if "__" in key:
            section, sub = key.split("__")
            config[section][sub] = value
        else:
            config[key] = value
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    summary = {"time_to_target_s": ttt, "env_steps_to_target": None if ttt is None else 8000,
               "final_eval": {"fp32": {"mean": final}, precision: {"mean": final}},
               "wall_s": wall, "env_steps_per_s": steps / wall, "energy_kwh": energy, "co2e_kg": co2e,
               "energy_source": "process-time model (test)", "carbon_backend": "process-time"}
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(summary, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for i, (step, wall_s, ret) in enumerate([(2000, 10.0, 20.0), (4000, 20.0, 200.0), (8000, 40.0, 480.0)]):
            f.write(json.dumps({"kind": "eval", "time": 0, "step": step, "version": i, "mean": ret + seed,
                                "wall_s": wall_s}) + "\n")
    return d
