"""What a sweep of the shipped ActorQ configs (5 seeds x fp32, int8-dynamic) would take on N workers: a projection.

Issue 32 asks what a cluster of N workers would need for 5 seeds of each shipped ActorQ config
(``configs/actorq/*.yaml``), from the measured per-run times. This is arithmetic on those times, not a
measurement of a cluster:

* **measured** per-run time: the archived ActorQ study runs (``benchmarks/results/actorq-study-runs.tar.gz``,
  read in place; ``--records`` names another archive or its extracted folder). A run counts for a config
  when its ``record.json`` command names that config file and changes nothing but the actors' precision,
  the carbon backend and a budget equal to the config's own (the replay-ratio sweep's runs do not count),
  and its precision is one of the study's. Per-run time: the median of their process wall seconds
  (``record.json``'s ``seconds``, from process start to exit). These runs stopped at their target.
* **estimated** (``est.``) for a config without such runs: its full budget's learner steps
  (``total_env_steps x learner.replay_ratio``: no stop at the target) x the median whole-run seconds per
  learner step (wall / ``summary.json``'s ``learner_steps``) of the measured runs of the same algorithm.
  A config with far fewer samples per insert (``replay_ratio x batch_size``) than those runs, such as the
  actor-bound one, spends its time in actors rather than learner steps: its estimate is marked ``low``.

Per config: runs = seeds x precisions; wall on N workers = ceil(runs / N) x per-run (one run per worker,
each worker the records' 2-vCPU machine, no start-up or scheduling added); vCPU-hours = runs x per-run x 2.
The last line is every config in one sweep: its runs handed out longest first to the least-loaded worker.

    python benchmarks/studies/actorq_sweep_plan.py
    python benchmarks/studies/actorq_sweep_plan.py --seeds 10 --workers 1 16 64 --records /tmp/aqruns/actorq-study-runs
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shlex
import statistics
import sys
import tarfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from pipelines.cli import cli_errors  # noqa: E402

RECORDS = os.path.join(ROOT, "benchmarks", "results", "actorq-study-runs.tar.gz")
PRECISIONS = ("fp32", "int8-dynamic")     # the ActorQ study's (configs/sweeps/actorq-study.yml)
WORKERS = (1, 8, 32, 100)
VCPUS_PER_WORKER = 2                       # the machine the records ran on, and one run per worker
NEUTRAL_KEYS = ("actors.precision", "carbon.backend")   # overrides that leave a run the shipped config's


def read_runs(path: str) -> Iterator[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """``(record.json, summary.json)`` of every run in an archive (``.tar.gz``) or an extracted folder."""
    if os.path.isdir(path):
        for rec in sorted(glob.glob(os.path.join(path, "**", "record.json"), recursive=True)):
            with open(rec) as f, open(os.path.join(os.path.dirname(rec), "summary.json")) as g:
                yield json.load(f), json.load(g)
        return
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
        for name in sorted(n for n in names if n.endswith("/record.json")):
            summary = name[:-len("record.json")] + "summary.json"
            if summary in names:
                yield json.load(tar.extractfile(name)), json.load(tar.extractfile(summary))


def shipped_run(cmd: str, config: str, total_env_steps: int) -> bool:
    """Whether ``cmd`` (a record's ``pipelines.train`` arguments) runs ``config`` as shipped (see the module doc)."""
    args = shlex.split(cmd)
    configs = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]
    if [os.path.normpath(c) for c in configs] != [os.path.normpath(config)]:
        return False
    for item in (args[i + 1] for i, a in enumerate(args[:-1]) if a == "--set"):
        key, _, value = item.partition("=")
        if key == "total_env_steps" and int(float(value.replace("_", ""))) == total_env_steps:
            continue
        if key not in NEUTRAL_KEYS:
            return False
    return True


def plan_row(per_run_s: float, runs: int, workers: Sequence[int]) -> Dict[str, Any]:
    """Per-run hours, wall hours on each N of ``workers`` (ceil(runs / N) rounds of one run) and vCPU-hours."""
    hours = per_run_s / 3600
    return {"per_run_h": hours, "runs": runs, "wall_h": {n: math.ceil(runs / n) * hours for n in workers},
            "vcpu_h": runs * hours * VCPUS_PER_WORKER}


def one_sweep_wall_s(durations: Sequence[float], workers: int) -> float:
    """Wall seconds of ``durations`` on ``workers``, each run in turn (longest first) to the least-loaded worker."""
    loads = [0.0] * workers
    for d in sorted(durations, reverse=True):
        loads[loads.index(min(loads))] += d
    return max(loads)


def collect(configs: Sequence[str], records: Sequence[Tuple[Dict[str, Any], Dict[str, Any]]],
            precisions: Sequence[str] = PRECISIONS) -> List[Dict[str, Any]]:
    """Per config (path relative to the repository): its measured runs' seconds, else an estimate with its inputs."""
    from core.config import load_config
    rows, per_step, spi = [], {}, {}
    for config in configs:
        cfg = load_config(os.path.join(ROOT, config), [])
        runs = [(r, s) for r, s in records if r.get("rc") == 0 and r.get("precision") in precisions
                and shipped_run(r["cmd"], config, cfg.total_env_steps)]
        rows.append({"config": config, "algo": cfg.agent.algo, "env_steps": cfg.total_env_steps,
                     "samples_per_insert": cfg.learner.replay_ratio * cfg.agent.batch_size,
                     "learner_steps": round(cfg.total_env_steps * cfg.learner.replay_ratio),
                     "seconds": sorted(r["seconds"] for r, _ in runs),
                     "dates": sorted({r["date"][:10] for r, _ in runs}),
                     "commits": sorted({r["commit"][:7] for r, _ in runs})})
        per_step.setdefault(cfg.agent.algo, []).extend(r["seconds"] / s["learner_steps"] for r, s in runs)
        spi.setdefault(cfg.agent.algo, []).extend(rows[-1]["samples_per_insert"] for _ in runs)
    for row in rows:
        if row["seconds"]:
            row.update(source="measured", per_run_s=statistics.median(row["seconds"]))
        elif per_step.get(row["algo"]):
            rate = statistics.median(per_step[row["algo"]])
            row.update(source="est.", s_per_learner_step=rate, rate_runs=len(per_step[row["algo"]]),
                       per_run_s=row["learner_steps"] * rate,
                       low=row["samples_per_insert"] < statistics.median(spi[row["algo"]]) / 2)
        else:
            row.update(source="none", per_run_s=None)
    return rows


def markdown(rows: Sequence[Dict[str, Any]], seeds: int, precisions: Sequence[str],
             workers: Sequence[int]) -> str:
    """The plan as a Markdown table, one line per config (``-`` where nothing was measured or estimated)."""
    runs = seeds * len(precisions)
    head = (["config", "per-run h", "from", f"runs ({seeds} seeds x {len(precisions)})"] +
            [f"wall h, N={n}" for n in workers] + [f"vCPU-h ({VCPUS_PER_WORKER}/worker)"])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for row in rows:
        name = os.path.splitext(os.path.basename(row["config"]))[0]
        if row["per_run_s"] is None:
            lines.append("| " + " | ".join([name, "-", "no measured run of its algorithm", str(runs)] +
                                           ["-"] * (len(workers) + 1)) + " |")
            continue
        plan = plan_row(row["per_run_s"], runs, workers)
        if row["source"] == "measured":
            s = row["seconds"]
            source = f"measured: median of {len(s)} ({s[0] / 3600:.2f}-{s[-1] / 3600:.2f} h)"
        else:
            source = (f"est.: {row['learner_steps']:,} learner steps x {row['s_per_learner_step'] * 1000:.0f} ms "
                      f"({row['algo'].upper()} runs' whole-run rate)" +
                      (f"; low: {row['samples_per_insert']:.2g} samples per insert" if row["low"] else ""))
        lines.append("| " + " | ".join([name, f"{plan['per_run_h']:.2f}", source, str(runs)] +
                                       [f"{plan['wall_h'][n]:.2f}" for n in workers] +
                                       [f"{plan['vcpu_h']:.1f}"]) + " |")
    planned = [r for r in rows if r["per_run_s"] is not None]
    durations = [r["per_run_s"] for r in planned for _ in range(runs)]
    if len(planned) > 1:
        lines.append("| " + " | ".join([f"**all {len(planned)}, one sweep**", "-", "longest run first",
                                        str(len(durations))] +
                                       [f"{one_sweep_wall_s(durations, n) / 3600:.2f}" for n in workers] +
                                       [f"{sum(durations) / 3600 * VCPUS_PER_WORKER:.1f}"]) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/studies/actorq_sweep_plan.py",
                                description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", default=RECORDS, metavar="PATH",
                   help="the ActorQ study's kept runs: a .tar.gz or its extracted folder (default: the archive)")
    p.add_argument("--seeds", type=int, default=5, metavar="N", help="seeds per config and precision (default 5)")
    p.add_argument("--workers", type=int, nargs="+", default=list(WORKERS), metavar="N",
                   help="cluster sizes to project (default 1 8 32 100)")
    p.add_argument("--configs", nargs="+", metavar="YAML",
                   help="configs to plan (default: configs/actorq/*.yaml)")
    return p


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from core.config import ConfigError
    if args.seeds < 1 or min(args.workers) < 1:
        raise ConfigError("--seeds and --workers must be >= 1")
    if not os.path.exists(args.records):
        raise ConfigError(f"--records {args.records!r} does not exist; valid: {os.path.relpath(RECORDS, ROOT)} "
                          "or its extracted folder")
    configs = args.configs or sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "configs",
                                                                                              "actorq", "*.yaml")))
    missing = [c for c in configs if not os.path.isfile(os.path.join(ROOT, c))]
    if missing:
        raise ConfigError(f"config {missing[0]!r} does not exist; valid: files under configs/actorq/")
    rows = collect(configs, list(read_runs(args.records)))
    print(markdown(rows, args.seeds, PRECISIONS, args.workers))
    measured = [r for r in rows if r["source"] == "measured"]
    print(f"\nA projection, not a measurement. Measured: {sum(len(r['seconds']) for r in measured)} runs of "
          f"{len(measured)} configs ({', '.join(sorted({d for r in measured for d in r['dates']}))}, commits "
          f"{', '.join(sorted({c for r in measured for c in r['commits']}))}; {os.path.relpath(args.records, ROOT)}), "
          f"each stopped at its target; the records name no machine (benchmarks/RESULTS.md places these runs on "
          f"Z5, a 2-vCPU AMD EPYC Zen 5 VM). est.: the full budget at the measured whole-run seconds per learner "
          f"step of the same algorithm (low: an actor-bound config). A seed that misses its target runs its whole "
          f"budget (longer than the measured ones). Wall h: ceil(runs / N) rounds of one run "
          f"per {VCPUS_PER_WORKER}-vCPU worker, no start-up or scheduling.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
