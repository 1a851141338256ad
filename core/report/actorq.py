"""The ActorQ comparison report: precisions x seeds per task, relative to fp32.

Input: comparable runs from :func:`core.report.runs.load_runs`. Per task x
precision, over seeds (``k`` runs):

* time to target ``T_p``: mean of ``summary.time_to_target_s`` over the
  seeds that reached ``eval.target_return`` (wall-clock from process start,
  confirmed evaluations); ``r/k`` shows how many reached it;
* speedup ``T_fp32 / T_p`` (> 1: faster than fp32);
* final return ``F_p``: mean of ``final_eval[p].mean`` (the best evaluated
  policy, re-evaluated at the actors' precision), and relative to fp32
  ``(F_p - F_fp32) / |F_fp32|`` (0% = equal; works for negative returns);
* energy ``E_p`` (kWh) and ``CO2e_p`` (kg): means of the run's
  ``energy_kwh`` / ``co2e_kg`` (whole run, see ``carbon.json``), with the
  measurement source;
* carbon ratio ``CO2e_fp32 / CO2e_p`` and energy ratio ``E_fp32 / E_p``
  (> 1: less than fp32);
* throughput ``env_steps / wall_s`` of the whole run and its ratio to fp32
  (> 1: faster), the speed comparison that exists even when a budget ends
  before the target; and the actors' own rate (env steps per second of
  actor time per worker, from the ``workers`` records), which isolates what
  int8 inference changes from what the learner and the machine add.

Curves: :func:`curves` puts each precision's seeds on one grid
(:func:`core.report.format.band_on_grid`, mean and min-max band).

Example::

    runs = load_runs(["runs/a-fp32-s0", "runs/a-int8-s0", ...])
    rows = summarize(runs)
    write_report(runs, "report/")         # report.md, rows.json, returns_*.png, speedup.png, carbon.png
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from core.report.format import _fmt, _slug, band_on_grid
from core.report.runs import Run, group_by_task


def _mean(values: List[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def summarize(runs: Sequence[Run]) -> List[Dict[str, Any]]:
    """One row per task x precision (see module docstring); fp32 first."""
    rows = []
    for task, group in group_by_task(runs).items():
        by_p: Dict[str, List[Run]] = defaultdict(list)
        for r in group:
            by_p[r.precision].append(r)
        stats = {}
        for p, rs in by_p.items():
            ttt = [r.summary.get("time_to_target_s") for r in rs]
            stats[p] = {
                "task": task, "precision": p, "seeds": len(rs),
                "target": rs[0].config["eval"]["target_return"],
                "reached": sum(t is not None for t in ttt),
                "time_to_target_s": _mean(ttt),
                "steps_to_target": _mean([r.summary.get("env_steps_to_target") for r in rs]),
                "final_return": _mean([r.summary["final_eval"].get(p, {}).get("mean") for r in rs]),
                "wall_s": _mean([r.summary.get("wall_s") for r in rs]),
                "env_steps_per_s": _mean([r.summary.get("env_steps_per_s") for r in rs]),
                "actor_steps_per_s": _mean([r.actor_steps_per_s for r in rs]),
                "energy_kwh": _mean([r.summary.get("energy_kwh") for r in rs]),
                "co2e_kg": _mean([r.summary.get("co2e_kg") for r in rs]),
                "energy_source": rs[0].summary.get("carbon_backend") or ("off" if rs[0].summary.get("energy_kwh")
                                                                         is None else "?"),
            }
        base = stats.get("fp32")
        for p in sorted(stats, key=lambda p: (p != "fp32", p)):
            s = stats[p]
            s["speedup"] = _ratio(base and base["time_to_target_s"], s["time_to_target_s"])
            s["final_rel"] = (None if not base or base["final_return"] in (None, 0) or s["final_return"] is None
                              else (s["final_return"] - base["final_return"]) / abs(base["final_return"]))
            s["energy_ratio"] = _ratio(base and base["energy_kwh"], s["energy_kwh"])
            s["throughput_ratio"] = _ratio(s["env_steps_per_s"], base and base["env_steps_per_s"])
            s["carbon_ratio"] = _ratio(base and base["co2e_kg"], s["co2e_kg"])
            rows.append(s)
    return rows


#: Per-seed ratios of :func:`paired_ratios`: name -> (fp32 summary, p summary) -> ratio (> 1: p better).
PAIRED = {
    "throughput": lambda b, p: _ratio(p.get("env_steps_per_s"), b.get("env_steps_per_s")),
    "time_to_target": lambda b, p: _ratio(b.get("time_to_target_s"), p.get("time_to_target_s")),
    "energy": lambda b, p: _ratio(b.get("energy_kwh"), p.get("energy_kwh")),
    "carbon": lambda b, p: _ratio(b.get("co2e_kg"), p.get("co2e_kg")),
}


def paired_ratios(runs: Sequence[Run]) -> List[Dict[str, Any]]:
    """Per task x precision (not fp32): each seed against fp32 of the same seed; median, min and max.

    Ratios are > 1 where the precision is better (faster, less energy); ``final_rel``
    is ``(F_p - F_fp32) / |F_fp32|`` per seed; ``learner_share`` is the fp32 runs'
    learner share of wall time (``summary.wall_split``), which says whether actors
    could matter at all.
    """
    out = []
    for task, group in group_by_task(runs).items():
        by = {(r.precision, r.config["seed"]): r.summary for r in group}
        for p in sorted({r.precision for r in group} - {"fp32"}):
            pairs = [(by[("fp32", seed)], by[(q, seed)]) for q, seed in sorted(by) if q == p and ("fp32", seed) in by]
            row: Dict[str, Any] = {"task": task, "precision": p, "pairs": len(pairs)}
            for name, fn in PAIRED.items():
                row[name] = _spread([fn(b, x) for b, x in pairs])
            row["final_rel"] = _spread([
                (x["final_eval"][p]["mean"] - b["final_eval"]["fp32"]["mean"]) / abs(b["final_eval"]["fp32"]["mean"])
                for b, x in pairs if b["final_eval"]["fp32"]["mean"]])
            row["learner_share"] = _spread([(b.get("wall_split") or {}).get("share", {}).get("learner")
                                            for b, _ in pairs])
            out.append(row)
    return out


def _spread(values: List[Optional[float]]) -> Optional[Dict[str, float]]:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": float(np.median(vals)), "min": float(min(vals)), "max": float(max(vals)), "n": len(vals)}


def spread_table(rows: Sequence[Dict[str, Any]]) -> str:
    """Markdown of :func:`paired_ratios`: ``median [min, max]`` per ratio."""
    def cell(v, fmt=".2f", suffix="x"):
        return "-" if v is None else (f"{v['median']:{fmt}}{suffix} [{v['min']:{fmt}}, {v['max']:{fmt}}]"
                                      + (f" (n={v['n']})" if suffix == "x" else ""))
    lines = ["| task | precision | seed pairs | throughput vs fp32 | time to target vs fp32 | energy ratio | "
             "carbon ratio | final return vs fp32 | fp32 learner share of wall |", "|" + "---|" * 9]
    for r in rows:
        pct = lambda v: None if v is None else {k: (100 * x if k != "n" else x) for k, x in v.items()}
        lines.append(f"| {r['task']} | {r['precision']} | {r['pairs']} | {cell(r['throughput'])} | "
                     f"{cell(r['time_to_target'])} | {cell(r['energy'])} | {cell(r['carbon'])} | "
                     f"{cell(pct(r['final_rel']), '+.1f', '%')} | {cell(pct(r['learner_share']), '.0f', '%')} |")
    return "\n".join(lines)


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None or b <= 0 else a / b


def markdown_table(rows: Sequence[Dict[str, Any]]) -> str:
    header = ["task", "precision", "seeds", "target", "reached", "time to target (s)", "env steps to target",
              "speedup vs fp32", "env steps/s", "throughput vs fp32", "actor env steps/s", "final return", "final vs fp32",
              "energy (kWh)", "energy ratio vs fp32", "CO2e (g)", "carbon ratio vs fp32", "energy source"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        cells = [r["task"], r["precision"], str(r["seeds"]), f"{r['target']:g}", f"{r['reached']}/{r['seeds']}",
                 _fmt(r["time_to_target_s"], ".1f"), _fmt(r["steps_to_target"], ",.0f"),
                 _fmt(r["speedup"], ".2f", "x"), _fmt(r["env_steps_per_s"], ".0f"),
                 _fmt(r["throughput_ratio"], ".2f", "x"), _fmt(r["actor_steps_per_s"], ".0f"),
                 _fmt(r["final_return"], ".1f"),
                 _fmt(None if r["final_rel"] is None else 100 * r["final_rel"], "+.1f", "%"),
                 _fmt(r["energy_kwh"], ".5f"), _fmt(r["energy_ratio"], ".2f", "x"), _fmt(None if r["co2e_kg"] is None else 1000 * r["co2e_kg"], ".3f"),
                 _fmt(r["carbon_ratio"], ".2f", "x"), r["energy_source"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curves(runs: Sequence[Run], x: str, points: int = 100) -> Dict[str, Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """``{precision: (grid, mean, lo, hi)}`` of evaluation return vs ``x`` ("wall_s" or "step")."""
    by_p: Dict[str, List[Run]] = defaultdict(list)
    for r in runs:
        if r.evals:
            by_p[r.precision].append(r)
    out = {}
    for p, rs in by_p.items():
        xs = [np.array([e["wall_s" if x == "wall_s" else "step"] for e in r.evals], float) for r in rs]
        ys = [np.array([e["mean"] for e in r.evals], float) for r in rs]
        out[p] = band_on_grid(xs, ys, points)
    return out


def plot_returns(task: str, runs: Sequence[Run], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, x, label in ((axes[0], "wall_s", "wall-clock seconds (from process start)"), (axes[1], "step", "env steps")):
        for p, (grid, mean, lo, hi) in sorted(curves(runs, x).items()):
            line, = ax.plot(grid, mean, label=p, marker="o", markersize=2, markevery=max(1, len(grid) // 20))
            ax.fill_between(grid, lo, hi, alpha=0.2, color=line.get_color())
        ax.axhline(runs[0].config["eval"]["target_return"], color="gray", ls="--", lw=1, label="target")
        ax.set_xlabel(label)
        ax.set_ylabel("evaluation return")
        ax.grid(alpha=0.3)
    axes[0].legend()
    seeds = len({r.config["seed"] for r in runs})
    fig.suptitle(f"{task}: mean and min-max over {seeds} seed(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def ratio_bars(paired: Sequence[Dict[str, Any]], key: str) -> List[Dict[str, Any]]:
    """The bars of a ratio plot from :func:`paired_ratios` rows: per task x precision, ``label``, the
    ``median`` of the per-seed ratios (0 where no seed pair has one: not reached / not measured), the
    whiskers ``lo``/``hi`` (min, max) and ``n`` seed pairs, the same numbers as the report's spread table."""
    bars = []
    for r in paired:
        v = r[key] or {"median": 0.0, "min": 0.0, "max": 0.0, "n": 0}
        bars.append({"label": f"{r['task']}\n{r['precision']} (n={v['n']})", "median": v["median"],
                     "lo": v["min"], "hi": v["max"], "n": v["n"]})
    return bars


def plot_bars(bars: Sequence[Dict[str, Any]], title: str, path: str) -> None:
    """Bars of :func:`ratio_bars` with min-max whiskers, the 1.0 line and the 1.5x goal."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(bars) + 2), 4))
    medians = [b["median"] for b in bars]
    ax.bar(range(len(bars)), medians, color=["C1" if v >= 1.5 else "C0" for v in medians],
           yerr=[[b["median"] - b["lo"] for b in bars], [b["hi"] - b["median"] for b in bars]], capsize=4)
    ax.axhline(1.0, color="black", lw=1)
    ax.axhline(1.5, color="gray", ls="--", lw=1, label="1.5x goal")
    ax.set_xticks(range(len(bars)), [b["label"] for b in bars], fontsize=7, rotation=15)
    ax.set_ylabel("fp32 / precision, same seed")
    ax.set_title(f"{title}: median over seed pairs, whiskers min-max\n0 = not reached / not measured", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(runs: Sequence[Run], out_dir: str) -> Dict[str, Any]:
    """Write ``report.md``, ``rows.json`` and the PNG plots into ``out_dir``; returns paths and rows."""
    os.makedirs(out_dir, exist_ok=True)
    rows = summarize(runs)
    files = []
    for task, group in group_by_task(runs).items():
        path = os.path.join(out_dir, f"returns-{_slug(task)}.png")
        plot_returns(task, group, path)
        files.append(path)
    paired = paired_ratios(runs)
    for key, title, name in (("time_to_target", "time-to-target speedup", "speedup.png"),
                             ("carbon", "carbon ratio", "carbon.png")):
        plot_bars(ratio_bars(paired, key), title, os.path.join(out_dir, name))
        files.append(os.path.join(out_dir, name))
    table = markdown_table(rows) + "\n\nPer seed against fp32 of the same seed, median [min, max]:\n\n" + \
        spread_table(paired)
    sources = sorted({r.summary.get("energy_source", "not measured") or "not measured" for r in runs})
    md = ["# ActorQ report", "", table, "", "Energy sources:", ""] + [f"- {s}" for s in sources] + \
         ["", "Runs:", ""] + [f"- {r.run_dir} ({r.task}, {r.precision}, seed {r.config['seed']})" for r in runs] + \
         [""] + [f"![{os.path.basename(f)}]({os.path.basename(f)})" for f in files]
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(out_dir, "rows.json"), "w") as f:
        json.dump(rows, f, indent=2)
    return {"rows": rows, "table": table, "files": files + [os.path.join(out_dir, "report.md")]}
