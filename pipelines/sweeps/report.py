"""The report of a sweep: per config x setting over seeds, with the field's statistics; written beside sweep.json.

For each group (config x grid setting), over its seeds (:mod:`core.report.aggregate` for the math):

* solved k/N (a run is solved when it reached the config's ``eval.target_return``: its
  ``time_to_target_s`` is set; N counts every run of the group, finished or not);
* env steps and wall seconds to target over the solved runs: median and IQM;
* final return (the summary's final evaluation at the actors' precision): IQM with a 95% stratified
  bootstrap CI (seeded, so the same runs give the same interval);
* probability of improvement of each setting over each other setting of the same config, on final
  return, with its CI;

and files ``report.md`` (the tables), ``report.json`` (the same rows),
``curves-<config>.png`` (evaluation return vs env steps and vs wall seconds: IQM across seeds with a
bootstrap band, one line per setting) and ``profiles.png`` (performance profiles: the fraction of runs
whose final return is above tau, with bands).

Example::

    result = write_sweep_report("sweeps/p")          # {"table": markdown, "files": [...]}
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from core.report import aggregate as agg
from core.report.format import _fmt, _slug, band_on_grid
from pipelines.sweeps.record import SweepDir, write_json
from pipelines.sweeps.spec import RunSpec

CURVE_POINTS, CURVE_REPS = 50, 300


def _label(run: RunSpec) -> str:
    return ", ".join(f"{k}={v}" for k, v in run.setting.items()) or "(base)"


def _config_name(run: RunSpec) -> str:
    return run.label


def _load(run_dir: str) -> Optional[Dict[str, Any]]:
    """Summary and evaluation records of a finished run, or None if it did not finish."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        return None
    from core.metrics import read_metrics
    with open(path) as f:
        summary = json.load(f)
    evals = sorted(read_metrics(run_dir, kind="eval"), key=lambda r: r["step"])
    return {"summary": summary, "evals": evals}


def _final_return(summary: Dict[str, Any]) -> Optional[float]:
    final = summary.get("final_eval") or {}
    row = final.get(summary.get("precision")) or (next(iter(final.values())) if final else None)
    return None if row is None else float(row["mean"])


def _center(values: List[float]) -> Tuple[Optional[float], Optional[float]]:
    """(median, IQM) of ``values``, or (None, None) when there are none."""
    if not values:
        return None, None
    return agg.median(values), agg.iqm(values)


def group_rows(sweep: SweepDir, runs: List[RunSpec], seed: int = 0) -> List[Dict[str, Any]]:
    """One row per config x setting, in the run list's order."""
    groups: "OrderedDict[Tuple[str, str], List[RunSpec]]" = OrderedDict()
    for run in runs:
        groups.setdefault((_config_name(run), _label(run)), []).append(run)
    rows = []
    for (config, setting), members in groups.items():
        loaded = [(r, _load(sweep.run_dir(r.name))) for r in members]
        done = [(r, d) for r, d in loaded if d is not None]
        solved = [d["summary"] for _, d in done if d["summary"].get("time_to_target_s") is not None]
        finals = [f for f in (_final_return(d["summary"]) for _, d in done) if f is not None]
        steps_med, steps_iqm = _center([float(s["env_steps_to_target"]) for s in solved])
        time_med, time_iqm = _center([float(s["time_to_target_s"]) for s in solved])
        iqm, lo, hi = agg.bootstrap_ci(finals, agg.iqm, seed=seed) if finals else (None, None, None)
        rows.append({"config": config, "setting": setting, "runs": len(members), "finished": len(done),
                     "solved": len(solved), "env_steps_to_target_median": steps_med,
                     "env_steps_to_target_iqm": steps_iqm, "time_to_target_s_median": time_med,
                     "time_to_target_s_iqm": time_iqm, "final_return_iqm": iqm, "final_return_ci": [lo, hi],
                     "final_returns": finals, "run_names": [r.name for r, _ in done],
                     "_evals": [d["evals"] for _, d in done]})
    return rows


def improvements(rows: List[Dict[str, Any]], seed: int = 0) -> List[Dict[str, Any]]:
    """P(setting A's final return > setting B's) with CI, for every ordered pair of settings of one config."""
    out = []
    for a in rows:
        for b in rows:
            if a is b or a["config"] != b["config"] or not a["final_returns"] or not b["final_returns"]:
                continue
            p, lo, hi = agg.probability_of_improvement_ci(a["final_returns"], b["final_returns"], seed=seed)
            out.append({"config": a["config"], "x": a["setting"], "y": b["setting"], "p": p, "ci": [lo, hi]})
    return out


def markdown(rows: List[Dict[str, Any]], comparisons: List[Dict[str, Any]]) -> str:
    lines = ["| config | setting | solved | env steps to target (median / IQM) | time to target s (median / IQM) "
             "| final return IQM [95% CI] |", "|---|---|---|---|---|---|"]
    for r in rows:
        ci = r["final_return_ci"]
        final = "-" if r["final_return_iqm"] is None else f"{r['final_return_iqm']:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]"
        lines.append(f"| {r['config']} | {r['setting']} | {r['solved']}/{r['runs']} "
                     f"| {_fmt(r['env_steps_to_target_median'], ',.0f')} / {_fmt(r['env_steps_to_target_iqm'], ',.0f')} "
                     f"| {_fmt(r['time_to_target_s_median'], '.1f')} / {_fmt(r['time_to_target_s_iqm'], '.1f')} "
                     f"| {final} |")
    if comparisons:
        lines += ["", "| config | P(X > Y) on final return | X | Y | 95% CI |", "|---|---|---|---|---|"]
        lines += [f"| {c['config']} | {c['p']:.2f} | {c['x']} | {c['y']} | [{c['ci'][0]:.2f}, {c['ci'][1]:.2f}] |"
                  for c in comparisons]
    return "\n".join(lines)


def _iqm_band(xs: List[np.ndarray], ys: List[np.ndarray]) -> Tuple[np.ndarray, ...]:
    """IQM across curves at each grid point (``band_on_grid``'s grid) and its 95% stratified bootstrap CI."""
    grid = band_on_grid(xs, ys, CURVE_POINTS)[0]
    vals = np.stack([np.interp(grid, x, y) for x, y in zip(xs, ys)])
    stats = [agg.bootstrap_ci(vals[:, i], agg.iqm, reps=CURVE_REPS, seed=i) for i in range(len(grid))]
    return grid, *(np.array(v) for v in zip(*stats))


def plot_curves(config: str, rows: List[Dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "step", "env steps"), (axes[1], "wall_s", "wall-clock seconds")):
        for r in rows:
            curves = [e for e in r["_evals"] if e]
            if not curves:
                continue
            xs = [np.array([e[key] for e in ev], float) for ev in curves]
            ys = [np.array([e["mean"] for e in ev], float) for ev in curves]
            grid, mid, lo, hi = _iqm_band(xs, ys)
            line, = ax.plot(grid, mid, label=f"{r['setting']} (n={len(curves)})")
            ax.fill_between(grid, lo, hi, alpha=0.2, color=line.get_color())
        ax.set_xlabel(label)
        ax.set_ylabel("evaluation return")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{config}: IQM over seeds, 95% stratified bootstrap band")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_profiles(rows: List[Dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    finals = [v for r in rows for v in r["final_returns"]]
    taus = np.linspace(min(finals), max(finals), 50) if finals else np.array([0.0])
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r["final_returns"]:
            f, lo, hi = agg.performance_profile_ci(r["final_returns"], taus, reps=CURVE_REPS)
            line, = ax.step(taus, f, where="post", label=f"{r['config']} {r['setting']}")
            ax.fill_between(taus, lo, hi, step="post", alpha=0.2, color=line.get_color())
    ax.set_xlabel("final return tau")
    ax.set_ylabel("fraction of runs with return > tau")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_sweep_report(sweep_dir: str, seed: int = 0) -> Dict[str, Any]:
    """Write report.md, report.json, curves-<config>.png and profiles.png into ``sweep_dir``."""
    sweep = SweepDir(sweep_dir)
    _, runs = sweep.load()
    rows = group_rows(sweep, runs, seed)
    comparisons = improvements(rows, seed)
    table = markdown(rows, comparisons)
    files = [os.path.join(sweep.root, "report.md"), os.path.join(sweep.root, "report.json")]
    with open(files[0], "w") as f:
        f.write(f"# Sweep {sweep.root}\n\n{table}\n")
    write_json(files[1], {"groups": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
                          "improvement": comparisons})
    for config in dict.fromkeys(r["config"] for r in rows):
        path = os.path.join(sweep.root, f"curves-{_slug(config)}.png")
        plot_curves(config, [r for r in rows if r["config"] == config], path)
        files.append(path)
    files.append(os.path.join(sweep.root, "profiles.png"))
    plot_profiles(rows, files[-1])
    return {"table": table, "files": files, "rows": rows, "improvement": comparisons}
