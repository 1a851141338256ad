"""Validate the ActorQ cost model: predicted vs measured whole-run env steps/s, settings back to back.

For each setting (a config plus overrides: replay ratio, learner batch, envs
per actor, precision) this runs, one after the other in fresh processes:

1. ``python -m benchmarks.studies.actorq_costs --quick`` for the setting (its costs,
   measured now, at the machine's load now), which predicts the run
   (``benchmarks.studies.actorq_model``: the block pipeline, ``prediction[p]["run"]``);
2. ``python -m pipelines.train`` of the setting, evaluations off (the model
   ignores them), then reads its ``schedule`` record and ``wall_split``.

Measured env steps/s = committed env steps / the driver loop's wall time (the
``schedule`` record: from the first block to the last commit, without start-up,
the end-of-run checkpoint and the final evaluation, which the model ignores).
Load averages before and after each step are recorded: the machine is shared.

Usage::

    python -m benchmarks.studies.actorq_validate --out benchmarks/results/actorq-validation.json
    python -m benchmarks.studies.actorq_validate --only 0 3 --out /tmp/v.json        # a subset of SETTINGS
    python -m benchmarks.studies.actorq_validate --scale 4 --out /tmp/v4.json        # every run 4x longer

``--scale K`` multiplies every setting's ``total_env_steps`` by K: the same
regimes with K times the blocks, so start-up (first traces, each worker's
first shard write) weighs less against the steady state a long training run
spends its time in.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = "configs/actorq/cartpole-dqn.yaml"

#: (name, config, precision, overrides): learner-bound first, actor-bound last (ActorQ-size policy throughout).
SETTINGS: List[tuple] = [
    ("r0.25 b64 8env", CARTPOLE, "int8-dynamic",
     ["learner.replay_ratio=0.25", "total_env_steps=2048"]),
    ("r0.05 b64 8env", CARTPOLE, "fp32", ["learner.replay_ratio=0.05", "total_env_steps=4096"]),
    ("r0.01 b32 8env", CARTPOLE, "fp32",
     ["learner.replay_ratio=0.01", "agent.batch_size=32", "total_env_steps=8192"]),
    ("r0.01 b32 8env", CARTPOLE, "int8-dynamic",
     ["learner.replay_ratio=0.01", "agent.batch_size=32", "total_env_steps=8192"]),
    # Actor-bound: 16k env steps give 30 learner steps, so the run measures a regime, not start-up.
    ("r0.002 b32 1env", CARTPOLE, "fp32",
     ["learner.replay_ratio=0.002", "agent.batch_size=32", "env.num_envs=1", "total_env_steps=16384"]),
    ("r0.002 b32 1env", CARTPOLE, "int8-dynamic",
     ["learner.replay_ratio=0.002", "agent.batch_size=32", "env.num_envs=1", "total_env_steps=16384"]),
    ("r0.002 b32 2env", CARTPOLE, "int8-full",
     ["learner.replay_ratio=0.002", "agent.batch_size=32", "env.num_envs=2", "total_env_steps=16384"]),
]
COMMON = ["eval.every_env_steps=10000000", "carbon.backend=process-time"]


def scaled(overrides: Sequence[str], k: int) -> List[str]:
    """``overrides`` with ``total_env_steps=N`` replaced by ``N * k``."""
    key = "total_env_steps="
    return [f"{key}{int(o[len(key):]) * k}" if o.startswith(key) else o for o in overrides]


def _sets(items: Sequence[str]) -> List[str]:
    return [a for item in items for a in ("--set", item)]


def _call(cmd: List[str], timeout: float) -> Dict[str, Any]:
    load, t0 = os.getloadavg()[0], time.time()
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, *cmd], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return {"rc": proc.returncode, "seconds": time.time() - t0, "load_before": load,
            "load_after": os.getloadavg()[0], "stderr_tail": proc.stderr[-1500:] if proc.returncode else ""}


def validate_one(name: str, config: str, precision: str, overrides: List[str], tmp: str,
                 cores: int, timeout: float) -> Dict[str, Any]:
    """Costs, then the run, of one setting; predicted and measured env steps/s."""
    sets = [*overrides, *COMMON, f"actors.precision={precision}"]
    costs_json, run_dir = os.path.join(tmp, "costs.json"), os.path.join(tmp, "run")
    row: Dict[str, Any] = {"name": name, "config": config, "precision": precision, "overrides": overrides}
    row["costs_call"] = _call(["-m", "benchmarks.studies.actorq_costs", "--config", config, "--quick",
                               "--cores", str(cores), "--precisions", precision, "--out", costs_json,
                               *_sets(sets)], timeout)
    row["run_call"] = _call(["-m", "pipelines.train", "--config", config, "--run-dir", run_dir, "--no-progress",
                             *_sets(sets)], timeout)
    if row["costs_call"]["rc"] or row["run_call"]["rc"]:
        return row
    with open(costs_json) as f:
        record = json.load(f)
    pred = record["prediction"][precision]
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        sched = [r for r in map(json.loads, f) if r["kind"] == "schedule"][-1]
    measured = summary["env_steps"] / sched["wall_s"]
    row.update({"costs": record["costs"], "setting": record["setting"], "predicted": pred,
                "predicted_env_steps_per_s": pred["run"]["env_steps_per_s"],
                "predicted_steady_env_steps_per_s": pred["env_steps_per_s"],
                "measured_env_steps_per_s": measured, "loop_wall_s": sched["wall_s"],
                "summary_wall_s": summary["wall_s"], "env_steps": summary["env_steps"],
                "learner_steps": summary["learner_steps"], "wall_split": summary["wall_split"],
                "error": pred["run"]["env_steps_per_s"] / measured - 1.0})
    return row


def run_costs(row: Dict[str, Any]) -> Dict[str, Any]:
    """The costs as the run itself met them (its wall_split and counts), in the model's format.

    learner s/step = learn_stage seconds / learner steps (tracing included), actor
    s/env step = rollout task seconds / env steps, write s/shard = write seconds /
    blocks; commit and version costs stay as measured. Fed to the model with
    contention off, they test its structure (pipelining, fill and drain) apart
    from how well costs measured before the run foresee the machine's load.
    """
    ws, costs, p = row["wall_split"], row["costs"], row["precision"]
    blocks = max(1, row["predicted"]["run"]["blocks"])
    c = dict(costs["precisions"][p])
    c["rollout"] = {"wall_s": ws["busy_s"]["actor_tasks"] / row["env_steps"], "cpu_s": 0.0}
    c.pop("rollout_parallel", None)
    c.pop("corun", None)
    storage = dict(costs["storage"], write_shard_s=ws["busy_s"]["shard_writes"] / blocks)
    learner = {"wall_s": ws["busy_s"]["learner"] / max(row["learner_steps"], 1), "cpu_s": 0.0,
               "trace_s": 0.0, "retrace_s": 0.0}
    return {"precisions": {p: c}, "storage": storage, "learner": learner}


def structure_check(row: Dict[str, Any]) -> float:
    """Env steps/s the model predicts from the run's own per-stage costs (:func:`run_costs`)."""
    from benchmarks.studies.actorq_model import simulate
    rc = run_costs(row)
    s = dict(row["setting"], cores=10 ** 6)       # contention off: the run's costs already carry it
    return simulate(rc["precisions"][row["precision"]], rc["storage"], rc["learner"], s,
                    row["env_steps"])["env_steps_per_s"]


def with_run_load(row: Dict[str, Any]) -> float:
    """Env steps/s predicted from the pre-measured costs, contention set by the load average around the run.

    Other users' runnable threads = the mean of the 1-minute load average before
    and after the run, less the run's own busy threads as the plain prediction
    had them (``W u_actors + u_learner``).
    """
    from benchmarks.studies.actorq_model import simulate
    p, c, s = row["precision"], row["costs"], row["setting"]
    run = row["predicted"]["run"]
    own = min(s["num_actors"], s["workers"]) * run["utilization"]["actors"] + run["utilization"]["learner"]
    load = (row["run_call"]["load_before"] + row["run_call"]["load_after"]) / 2
    return simulate(c["precisions"][p], c["storage"], c["learner"], s, row["env_steps"],
                    others=load - own)["env_steps_per_s"]


def table(rows: List[Dict[str, Any]]) -> str:
    """The validation table (markdown)."""
    head = ("| setting | precision | env steps | learner steps | predicted env steps/s (steady) | measured | error | "
            "with the run's load average | from the run's own stage costs | predicted bound | measured split learner/actors/storage/broadcast/other "
            "| learner ms/step costs -> run | actor us/step costs -> run | load |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    out = []
    for r in rows:
        if "error" not in r:
            out.append(f"| {r['name']} | {r['precision']} | failed: see JSON | | | | | | | | | | | |")
            continue
        rc, c = run_costs(r), r["costs"]
        par = c["precisions"][r["precision"]].get("rollout_parallel") or c["precisions"][r["precision"]]["rollout"]
        own, loaded = structure_check(r), with_run_load(r)
        stages = (f"{1e3 * c['learner']['wall_s']:.0f} -> {1e3 * rc['learner']['wall_s']:.0f} | "
                  f"{1e6 * par['wall_s']:.0f} -> {1e6 * rc['precisions'][r['precision']]['rollout']['wall_s']:.0f}")
        sh = r["wall_split"]["share"]
        split = "/".join(f"{100 * sh[k]:.0f}" for k in ("learner", "actors", "storage", "broadcast", "other"))
        bound = r["predicted"]["bound"] + " (" + r["predicted"]["run"]["bound"] + ")"
        out.append(f"| {r['name']} | {r['precision']} | {r['env_steps']} | {r['learner_steps']} | "
                   f"{r['predicted_env_steps_per_s']:.0f} ({r['predicted_steady_env_steps_per_s']:.0f}) | "
                   f"{r['measured_env_steps_per_s']:.0f} | {100 * r['error']:+.0f}% | "
                   f"{loaded:.0f} ({100 * (loaded / r['measured_env_steps_per_s'] - 1):+.0f}%) | "
                   f"{own:.0f} ({100 * (own / r['measured_env_steps_per_s'] - 1):+.0f}%) | {bound} | {split} % | "
                   f"{stages} | {r['costs_call']['load_before']:.1f}-{r['run_call']['load_after']:.1f} |")
    return head + "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="+", type=int, metavar="I",
                    help=f"run only these settings, by index 0..{len(SETTINGS) - 1} (learner-bound first)")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                    help="cores the model assumes (default: this machine's)")
    ap.add_argument("--scale", type=int, default=1, metavar="K",
                    help="multiply every setting's total_env_steps by K (default 1)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per costs call and per run")
    ap.add_argument("--out", required=True, help="the validation JSON to write (or, with --table, to read)")
    ap.add_argument("--table", action="store_true", help="print the table of an existing --out JSON, run nothing")
    args = ap.parse_args(argv)
    if args.table:
        with open(args.out) as f:
            print(table(json.load(f)["rows"]))
        return 0
    bad = [i for i in args.only or [] if not 0 <= i < len(SETTINGS)]
    if bad:
        print(f"error: --only {bad[0]} is out of range; valid: 0..{len(SETTINGS) - 1}", file=sys.stderr)
        return 2
    if args.scale < 1:
        print(f"error: --scale {args.scale} must be a positive integer", file=sys.stderr)
        return 2
    chosen = [(name, config, precision, scaled(overrides, args.scale))
              for name, config, precision, overrides in
              ([SETTINGS[i] for i in args.only] if args.only else SETTINGS)]
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    for name, config, precision, overrides in chosen:
        with tempfile.TemporaryDirectory(prefix="actorq-validate-") as tmp:
            rows.append(validate_one(name, config, precision, overrides, tmp, args.cores, args.timeout))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    record = {"schema": "databloom.actorq_validation/1", "started": started, "cores": args.cores,
              "command": "python -m benchmarks.studies.actorq_validate " + " ".join(argv or sys.argv[1:]),
              "cpu_count": os.cpu_count(), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
