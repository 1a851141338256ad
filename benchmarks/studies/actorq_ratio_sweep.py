"""The replay-ratio sweep of the ActorQ study: how low a replay ratio still reaches the target, and what
int8 actors would buy there.

Issue 14's fallback result, for a task where no setting on this machine both learns and is actor-bound:
the lowest replay ratio at which the task still reaches its target over the seeds measured, and the int8
speedup the cost model predicts at that ratio. Lowering the ratio is the only lever that moves a run
toward the actors (fewer learner steps per env step, the same network and target), so the sweep shows
how far that lever goes before learning breaks.

Reads the runs of a sweep directory (``--sweep``: the runs of ``configs/sweeps/actorq-ratio.yml``, made by
``python -m pipelines.sweep configs/sweeps/actorq-ratio.yml --out DIR``), or the fp32 runs kept by the
ActorQ study (``--keep DIR``, one folder per setting ``<task>-<size>-<budget>[--<overrides>]``: the layout
of the published records, which the study's old loop made), groups them by the replay ratio in their configs, and
prints per ratio: seeds that reached the target, env steps and learner steps to target, wall time to
target, and the fp32 runs' learner and actor shares of wall time (``summary.json`` ``wall_split``).
With ``--costs`` (a ``benchmarks.studies.actorq_costs --out`` file for the same config) each ratio also gets the
model's whole-run int8 speedup over fp32, played out to that ratio's median env steps to target; where a
setting kept int8 runs too, their measured time-to-target ratio (median over seed pairs) stands beside it.

Usage (the committed records are packed: ``tar xzf benchmarks/results/actorq-study-runs.tar.gz -C
benchmarks/results`` first)::

    python -m pipelines.sweep configs/sweeps/actorq-ratio.yml --out sweeps/actorq-ratio --workers 1
    python -m benchmarks.studies.actorq_ratio_sweep --sweep sweeps/actorq-ratio \
        --costs benchmarks/results/actorq-costs-cartpole.json --out sweeps/actorq-ratio/ratio-sweep.png
    python -m benchmarks.studies.actorq_ratio_sweep --keep benchmarks/results/actorq-study-runs \\
        --task cartpole-dqn --size actorq --costs benchmarks/results/actorq-costs-cartpole.json \\
        --out benchmarks/results/actorq-ratio-sweep.png --json benchmarks/results/actorq-ratio-sweep.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from core.report.actorq import _spread, paired_ratios   # median/min/max without Nones; per-seed-pair ratios


class SweepError(ValueError):
    """Bad sweep input (one-line message)."""


def _cell(v: Optional[Dict[str, float]], fmt: str = ",.0f") -> str:
    if v is None:
        return "-"
    if v["n"] == 1:
        return f"{v['median']:{fmt}}"
    return f"{v['median']:{fmt}} [{v['min']:{fmt}}, {v['max']:{fmt}}]"


def setting_dirs(keep: str, task: str, size: str) -> List[str]:
    """The kept setting folders of ``task`` at ``size`` (their names start ``<task>-<size>-``)."""
    if not os.path.isdir(keep):
        raise SweepError(f"--keep {keep!r} is not a directory; pass the folder given to "
                         f"python -m benchmarks.studies.actorq_study --keep")
    prefix = f"{task}-{size}-"
    return sorted(os.path.join(keep, d) for d in os.listdir(keep)
                  if d.startswith(prefix) and os.path.isdir(os.path.join(keep, d)))


def points_of(run_dirs: Sequence[str]) -> Dict[float, Dict[str, list]]:
    """``{replay_ratio: {precision: [Run, ...]}}`` from the finished runs among ``run_dirs``."""
    from core.report.runs import load_run
    points: Dict[float, Dict[str, list]] = {}
    for rdir in run_dirs:
        if not os.path.isfile(os.path.join(rdir, "summary.json")):
            continue
        run = load_run(rdir)
        ratio = float(run.config["learner"]["replay_ratio"])
        points.setdefault(ratio, {}).setdefault(run.precision, []).append(run)
    return points


def load_points(keep: str, task: str, size: str) -> Dict[float, Dict[str, list]]:
    """The points of every kept run of the task at this size (the published records' layout)."""
    points = points_of([os.path.join(sdir, name) for sdir in setting_dirs(keep, task, size)
                        for name in sorted(os.listdir(sdir))])
    if not points:
        raise SweepError(f"no kept runs of {task!r} at size {size!r} under {keep!r}; make them with "
                         f"python -m benchmarks.studies.actorq_study --to-target --tasks {task} --keep {keep}")
    return points


def sweep_points(sweep_dir: str) -> Dict[float, Dict[str, list]]:
    """The points of a sweep directory's finished runs (``python -m pipelines.sweep configs/sweeps/actorq-ratio.yml``)."""
    from core.config import ConfigError
    from pipelines.sweeps.record import SweepDir
    try:
        sweep = SweepDir(sweep_dir)
        _, runs = sweep.load()
    except ConfigError as e:
        raise SweepError(str(e)) from None
    points = points_of([sweep.run_dir(r.name) for r in runs])
    if not points:
        raise SweepError(f"no run of the sweep in {sweep_dir!r} has finished; continue it with "
                         f"python -m pipelines.sweep --resume {sweep_dir}")
    return points


def _predicted_speedup(costs: Dict[str, Any], config: Dict[str, Any], precision: str, cores: int,
                       env_steps: int) -> Optional[float]:
    from benchmarks.studies.actorq_model import predict, setting
    from core.config import from_dict
    if precision not in costs["precisions"] or "fp32" not in costs["precisions"]:
        raise SweepError(f"--costs has no {precision!r} or no fp32 costs; measure both with "
                         f"python -m benchmarks.studies.actorq_costs --precisions fp32 {precision}")
    pred = predict(costs, setting(from_dict(config), cores), env_steps)
    return pred[precision]["run"]["speedup_vs_fp32"]


def _workers_busy(run) -> Optional[float]:
    """The fraction of the actor workers' wall time their rollout tasks ran (``wall_split.busy_s``)."""
    w = run.summary.get("wall_split") or {}
    busy, n, wall = (w.get("busy_s") or {}).get("actor_tasks"), w.get("actor_workers"), w.get("wall_s")
    return busy / (n * wall) if busy is not None and n and wall else None


def sweep_rows(points: Dict[float, Dict[str, list]], costs: Optional[Dict[str, Any]] = None,
               precision: str = "int8-dynamic", cores: int = 2) -> List[Dict[str, Any]]:
    """One row per replay ratio (highest first): what the fp32 runs reached and what the model predicts."""
    rows = []
    for ratio in sorted(points, reverse=True):
        fp32 = sorted(points[ratio].get("fp32", []), key=lambda r: r.config["seed"])
        if not fp32:
            continue
        reached = [r for r in fp32 if r.summary.get("env_steps_to_target") is not None]
        steps = [r.summary["env_steps_to_target"] for r in reached]
        batch = fp32[0].config["agent"]["batch_size"]
        share = lambda r, k: (r.summary.get("wall_split") or {}).get("share", {}).get(k)
        row: Dict[str, Any] = {
            "replay_ratio": ratio, "samples_per_insert": ratio * batch,
            "budget_env_steps": fp32[0].config["total_env_steps"],
            "seeds": [r.config["seed"] for r in fp32], "reached": len(reached), "runs": len(fp32),
            "env_steps_to_target": _spread(steps),
            # the plan's learner steps by an env step are floor(ratio x rows): exact at a block's end
            "learner_steps_to_target": _spread([int(ratio * s) for s in steps]),
            "time_to_target_s": _spread([r.summary["time_to_target_s"] for r in reached]),
            "learner_share": _spread([share(r, "learner") for r in fp32]),
            "actors_share": _spread([share(r, "actors") for r in fp32]),
            "actor_workers_busy": _spread([_workers_busy(r) for r in fp32]),
            "measured_precision": precision, "predicted_speedup": None,
            # fp32 / precision time to target per seed pair, as the study's report pairs them
            "measured_time_ratio": next((p["time_to_target"] for p in
                                         paired_ratios(fp32 + points[ratio].get(precision, []))
                                         if p["precision"] == precision), None),
        }
        if costs is not None and steps:
            row["predicted_speedup"] = _predicted_speedup(costs, fp32[0].config, precision, cores,
                                                          int(np.median(steps)))
        rows.append(row)
    return rows


def markdown(rows: Sequence[Dict[str, Any]], target: Optional[float] = None) -> str:
    p = rows[0]["measured_precision"] if rows else "int8"
    lines = [f"| replay ratio | samples per insert | fp32 reached{f' {target:g}' if target is not None else ''} "
             f"| env steps to target | learner steps to target | wall s to target | fp32 learner / actors "
             f"share of wall | fp32 actor workers busy | model: {p} whole-run speedup | measured {p} time-to-target ratio |",
             "|" + "---|" * 10]
    pct = lambda v: None if v is None else {k: (100 * x if k != "n" else x) for k, x in v.items()}
    for r in rows:
        share = f"{_cell(pct(r['learner_share']), '.0f')}% / {_cell(pct(r['actors_share']), '.1f')}%"
        model = "-" if r["predicted_speedup"] is None else f"{r['predicted_speedup']:.2f}x"
        meas = r["measured_time_ratio"]
        meas = "-" if meas is None else _cell(meas, ".2f") + f"x (n={meas['n']})"
        lines.append(f"| {r['replay_ratio']:g} | {r['samples_per_insert']:g} | {r['reached']}/{r['runs']} "
                     f"(budget {r['budget_env_steps']:,}) | {_cell(r['env_steps_to_target'])} | "
                     f"{_cell(r['learner_steps_to_target'])} | {_cell(r['time_to_target_s'])} | {share} | "
                     f"{_cell(pct(r['actor_workers_busy']), '.1f')}% | "
                     f"{model} | {meas} |")
    return "\n".join(lines)


def plot(rows: Sequence[Dict[str, Any]], out: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r["env_steps_to_target"] is not None]
    if not rows:
        raise SweepError("no ratio reached the target: nothing to plot")
    x = np.array([r["replay_ratio"] for r in rows])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))

    def band(ax, key, scale, label, color):
        med = np.array([r[key]["median"] for r in rows]) * scale
        lo = med - np.array([r[key]["min"] for r in rows]) * scale
        hi = np.array([r[key]["max"] for r in rows]) * scale - med
        ax.errorbar(x, med, yerr=[lo, hi], marker="o", capsize=3, label=label, color=color)
        for xi, m, r in zip(x, med, rows):
            ax.annotate(f"{r['reached']}/{r['runs']} seeds", (xi, m), textcoords="offset points",
                        xytext=(4, 6), fontsize=7)

    band(a, "env_steps_to_target", 1e-3, "env steps to target (k)", "C0")
    band(a, "learner_steps_to_target", 1e-3, "learner steps to target (k)", "C1")
    a.set_xscale("log", base=2)
    a.set_xlabel("replay ratio (learner steps per env step)")
    a.set_ylabel("thousands")
    a.set_ylim(bottom=0)
    a.set_title("what reaching the target costs (fp32, median, min-max)")
    a.legend(fontsize=8)
    band(b, "time_to_target_s", 1 / 60, "fp32 wall to target (min)", "C2")
    b.set_xscale("log", base=2)
    b.set_xlabel("replay ratio")
    b.set_ylabel("minutes")
    b.set_ylim(bottom=0)
    pred = [(r["replay_ratio"], r["predicted_speedup"]) for r in rows if r["predicted_speedup"] is not None]
    if pred:
        b2 = b.twinx()
        b2.plot([p[0] for p in pred], [p[1] for p in pred], "s--", color="C3",
                label=f"model: {rows[0]['measured_precision']} speedup")
        meas = [(r["replay_ratio"], r["measured_time_ratio"]["median"]) for r in rows if r["measured_time_ratio"]]
        if meas:
            b2.plot([m[0] for m in meas], [m[1] for m in meas], "D", color="C4",
                    label="measured time-to-target ratio")
        b2.axhline(1.5, color="grey", lw=0.8, ls=":")
        b2.set_ylabel("int8 vs fp32 (x)")
        b2.set_ylim(0, max(1.6, max(p[1] for p in pred) * 1.1))
        b2.legend(fontsize=8, loc="lower right")
    b.set_title("wall time, and what int8 actors would buy")
    b.legend(fontsize=8, loc="lower left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from benchmarks.studies.actorq_study import TASKS
    ap = argparse.ArgumentParser(prog="python -m benchmarks.studies.actorq_ratio_sweep",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", default="benchmarks/results/actorq-study-runs",
                    help="the actorq_study --keep folder holding the sweep's settings (the committed records: "
                         "tar xzf benchmarks/results/actorq-study-runs.tar.gz -C benchmarks/results)")
    ap.add_argument("--sweep", metavar="SWEEP_DIR",
                    help="read the runs of this sweep directory instead of --keep (e.g. one of "
                         "configs/sweeps/actorq-ratio.yml)")
    ap.add_argument("--task", default="cartpole-dqn", choices=sorted(TASKS), help="the study task (with --keep)")
    ap.add_argument("--size", default="actorq", choices=["actorq", "actor-bound", "small"],
                    help="the study --size whose settings form the sweep")
    ap.add_argument("--costs", metavar="COSTS_JSON",
                    help="a benchmarks.studies.actorq_costs --out file of the same config: adds the model's speedup")
    ap.add_argument("--precision", default="int8-dynamic", choices=["fp16", "int8-dynamic", "int8-full"],
                    help="the precision whose speedup over fp32 is predicted (and measured where kept)")
    ap.add_argument("--cores", type=int, default=2, help="cores for the model (default 2: this machine)")
    ap.add_argument("--out", metavar="PNG", help="write the plot here")
    ap.add_argument("--json", metavar="JSON", help="write the rows here")
    args = ap.parse_args(argv)
    try:
        costs = None
        if args.costs:
            try:
                with open(args.costs) as f:
                    costs = json.load(f)["costs"]
            except (OSError, ValueError, KeyError) as e:
                raise SweepError(f"--costs {args.costs!r} is not a benchmarks.studies.actorq_costs --out file ({e})")
        points = sweep_points(args.sweep) if args.sweep else load_points(args.keep, args.task, args.size)
        rows = sweep_rows(points, costs, args.precision, args.cores)
        if not rows:
            raise SweepError(f"no fp32 runs under {args.sweep or args.keep!r}: every ratio needs its fp32 seeds")
        any_run = next(iter(next(iter(points.values())).values()))[0]
        target = any_run.config["eval"].get("target_return")
        print(markdown(rows, target))
        if args.out:
            plot(rows, args.out, f"ActorQ replay-ratio sweep: {any_run.task}, {args.size} size, target {target:g} "
                                 f"({args.cores} cores; assumptions of the model: benchmarks/studies/actorq_model.py)")
            print(f"plot: {args.out}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"task": args.task, "size": args.size, "keep": args.keep, "costs": args.costs,
                           "cores": args.cores, "rows": rows}, f, indent=2)
            print(f"rows: {args.json}")
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
