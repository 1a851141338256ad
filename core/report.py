"""Reports from run directories: the ActorQ comparison (precisions x seeds) and the learning suite (configs x seeds).

Input: run directories written by ``pipelines.train`` (``config.json``,
``summary.json``, ``metrics.jsonl`` with ``eval`` records). Runs are grouped
by task (env id + algorithm); inside a group their configs may differ only
in ``actors.precision`` and ``seed`` (``name`` and ``run_dir`` are labels and
ignored), otherwise :class:`ReportError` names the differing keys.

Per task x precision, over seeds (``k`` runs):

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

Curves: each seed's evaluation returns are interpolated (linearly, held
flat after its last evaluation) onto a common grid of wall-clock seconds or
env steps, from the first evaluation of any seed to the last; the plot shows the mean across seeds and a min-max band.

The learning suite (``benchmarks/learning_suite.py``) uses the second half:
:func:`suite_record` turns a finished run directory into one JSON record
(summary fields, plus the evaluation curve and best confirmed return from
``metrics.jsonl``); :func:`suite_rows` aggregates records per config label
(solved k/N, medians of env steps and time to target with an unsolved run
counted as infinitely slow, median final return); :func:`plot_suite_curves`
draws the median and min-max band over seeds (:func:`band_on_grid`, the
same interpolation as above).

Example::

    runs = load_runs(["runs/a-fp32-s0", "runs/a-int8-s0", ...])
    rows = summarize(runs)
    write_report(runs, "report/")         # report.md, returns_*.png, speedup.png, carbon.png

    records = [dict(suite_record(d), label="configs/default.yaml", seed=s) for s, d in enumerate(dirs)]
    write_suite_report(records, "suite/")  # learning-suite.md, configs-default-yaml.png
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from core import config as config_lib
from core import urls

#: config keys allowed to differ between runs of one task
VARYING_KEYS = ("actors.precision", "seed", "name", "run_dir")


class ReportError(ValueError):
    """Bad report input (one-line message)."""


@dataclasses.dataclass
class Run:
    run_dir: str
    config: Dict[str, Any]
    summary: Dict[str, Any]
    evals: List[Dict[str, Any]]
    workers: Optional[Dict[str, Any]] = None

    @property
    def actor_steps_per_s(self) -> Optional[float]:
        """Env steps per second of actor time (stepping + inference, not waiting), per worker."""
        rows = (self.workers or {}).values()
        steps = sum(r["env_steps"] for r in rows)
        seconds = sum(r["env_steps"] / r["env_steps_per_s"] for r in rows if r.get("env_steps_per_s"))
        return steps / seconds if seconds > 0 else None

    @property
    def task(self) -> str:
        return f"{self.config['env']['id']} {self.config['agent']['algo']}"

    @property
    def precision(self) -> str:
        return self.config["actors"]["precision"]


def _read_json(run_dir: str, name: str) -> Any:
    fs, path = urls.resolve(run_dir)
    if not fs.exists(f"{path}/{name}"):
        raise ReportError(f"{run_dir!r} is not a finished run directory (no {name}); "
                          f"pass directories written by python -m pipelines.train")
    with fs.open(f"{path}/{name}", "r") as f:
        return json.load(f)


def load_run(run_dir: str) -> Run:
    """Config, summary and evaluation records of one run directory."""
    from core.metrics import read_metrics
    config, summary = _read_json(run_dir, "config.json"), _read_json(run_dir, "summary.json")
    evals = sorted(read_metrics(run_dir, kind="eval"), key=lambda r: r["step"])
    workers = read_metrics(run_dir, kind="workers")
    return Run(run_dir, config, summary, evals, workers[-1]["workers"] if workers else None)


def load_runs(run_dirs: Sequence[str]) -> List[Run]:
    if not run_dirs:
        raise ReportError("no run directories given; pass one or more RUN_DIRs")
    runs = [load_run(d) for d in run_dirs]
    check_comparable(runs)
    return runs


def group_by_task(runs: Sequence[Run]) -> Dict[str, List[Run]]:
    groups: Dict[str, List[Run]] = defaultdict(list)
    for r in runs:
        groups[r.task].append(r)
    return dict(groups)


def check_comparable(runs: Sequence[Run]) -> None:
    """Raise ReportError naming the keys in which runs of one task differ (beyond VARYING_KEYS)."""
    for task, group in group_by_task(runs).items():
        flat = [config_lib.flatten(r.config) for r in group]
        keys = sorted(set().union(*flat))
        differing = [k for k in keys if k not in VARYING_KEYS
                     and len({json.dumps(f.get(k), sort_keys=True) for f in flat}) > 1]
        if differing:
            shown = ", ".join(differing[:8]) + (f" (+{len(differing) - 8} more)" if len(differing) > 8 else "")
            raise ReportError(f"runs of task {task!r} differ in {shown}; configs may differ only in "
                              f"actors.precision and seed")


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


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None or b <= 0 else a / b


def _fmt(v: Optional[float], spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


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


def band_on_grid(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], points: int = 100,
                 center: str = "mean") -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(grid, center, lo, hi)`` of curves ``(xs[i], ys[i])`` resampled on one grid.

    The grid spans the first x of any curve to the last x of any curve in
    ``points`` even steps. Each curve is interpolated linearly and held flat
    outside its own range (``np.interp``): a run that stopped at its target
    keeps its last return. ``center`` is ``"mean"`` or ``"median"`` across
    curves at each grid point; ``lo`` / ``hi`` are the min and max.
    """
    grid = np.linspace(min(v.min() for v in xs), max(v.max() for v in xs), points)
    vals = np.stack([np.interp(grid, xv, yv) for xv, yv in zip(xs, ys)])
    mid = np.median(vals, 0) if center == "median" else vals.mean(0)
    return grid, mid, vals.min(0), vals.max(0)


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


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-").lower()


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


def plot_bars(rows: Sequence[Dict[str, Any]], key: str, title: str, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r["precision"] != "fp32"]
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(rows) + 2), 4))
    labels = [f"{r['task']}\n{r['precision']}" for r in rows]
    values = [r[key] or 0.0 for r in rows]
    ax.bar(range(len(rows)), values, color=["C1" if v >= 1.5 else "C0" for v in values])
    ax.axhline(1.0, color="black", lw=1)
    ax.axhline(1.5, color="gray", ls="--", lw=1, label="1.5x goal")
    ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=15)
    ax.set_ylabel(f"{title} (fp32 / precision)")
    ax.set_title(title + "; 0 = not reached / not measured")
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
    for key, title, name in (("speedup", "time-to-target speedup", "speedup.png"),
                             ("carbon_ratio", "carbon ratio", "carbon.png")):
        plot_bars(rows, key, title, os.path.join(out_dir, name))
        files.append(os.path.join(out_dir, name))
    table = markdown_table(rows)
    sources = sorted({r.summary.get("energy_source", "not measured") or "not measured" for r in runs})
    md = ["# ActorQ report", "", table, "", "Energy sources:", ""] + [f"- {s}" for s in sources] + \
         ["", "Runs:", ""] + [f"- {r.run_dir} ({r.task}, {r.precision}, seed {r.config['seed']})" for r in runs] + \
         [""] + [f"![{os.path.basename(f)}]({os.path.basename(f)})" for f in files]
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(out_dir, "rows.json"), "w") as f:
        json.dump(rows, f, indent=2)
    return {"rows": rows, "table": table, "files": files + [os.path.join(out_dir, "report.md")]}


# -- learning suite: one record per run, one row and one plot per config ---------------------------------------------
# benchmarks/learning_suite.py runs the shipped configs for several seeds; these functions turn each finished run
# directory into a JSON record and the records into the suite's table and curves.

def first_hit(evals: Sequence[Dict[str, Any]], target: float, confirm_episodes: int) -> Optional[Dict[str, Any]]:
    """The first evaluation that counts as solved (the rule of ``pipelines.summary.record_target``).

    Solved: the confirmed mean (or, with ``confirm_episodes == 0``, the mean)
    is at or above ``target``. Returns that ``eval`` record, or None.
    """
    for e in sorted(evals, key=lambda e: e["step"]):
        score = e.get("confirmed_mean") if e.get("confirmed_mean") is not None else e["mean"]
        if score >= target and (e.get("confirmed_mean") is not None or confirm_episodes == 0):
            return e
    return None


def suite_record(run_dir: str) -> Dict[str, Any]:
    """The learning-suite fields of one finished run directory.

    Read from ``summary.json`` where it has them. ``best_confirmed_return``
    (the highest confirmed mean of any evaluation) and ``curve`` (``[env
    steps, seconds from process start, mean return]`` per evaluation) are not
    in the summary and come from ``metrics.jsonl``'s ``eval`` records, as do
    time and env steps to target if a summary lacks them; ``derived`` names
    every field taken from ``metrics.jsonl``.
    """
    run = load_run(run_dir)
    s, cfg = run.summary, run.config
    target, confirm = float(cfg["eval"]["target_return"]), int(cfg["eval"].get("confirm_episodes", 0))
    derived = ["best_confirmed_return", "curve"]
    ttt, steps = s.get("time_to_target_s"), s.get("env_steps_to_target")
    if "time_to_target_s" not in s or "env_steps_to_target" not in s:
        hit = first_hit(run.evals, target, confirm)
        ttt, steps = (hit["wall_s"], hit["step"]) if hit else (None, None)
        derived += ["time_to_target_s", "env_steps_to_target"]
    precision = s.get("precision", cfg["actors"]["precision"])
    final = s["final_eval"].get(precision, {}).get("mean")
    confirmed = [e["confirmed_mean"] for e in run.evals if e.get("confirmed_mean") is not None]
    return {"executor": s.get("executor", cfg.get("executor")), "env_id": cfg["env"]["id"],
            "algo": cfg["agent"]["algo"], "precision": precision, "target_return": target,
            "reached": ttt is not None, "env_steps_to_target": steps, "time_to_target_s": ttt,
            "final_return": final, "ended_at_target": final is not None and final >= target,
            "best_eval_return": s.get("best_eval_return") if s.get("best_version", 0) >= 0 else None,
            "best_confirmed_return": max(confirmed) if confirmed else None,
            "env_steps": s.get("env_steps"), "total_env_steps": cfg.get("total_env_steps"),
            "train_wall_s": s.get("wall_s"), "derived": derived,
            "curve": [[e["step"], e["wall_s"], e["mean"]] for e in run.evals]}


def median_to_target(values: Sequence[Optional[float]]) -> Optional[float]:
    """Median with runs that never reached the target counted as infinitely slow; None if that median is inf."""
    if not values:
        return None
    m = float(np.median([np.inf if v is None else float(v) for v in values]))
    return None if np.isinf(m) else m


def suite_rows(records: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per config label (in order of first appearance), aggregated over its seeds.

    ``solved`` counts runs with ``reached``; ``failed`` counts runs whose
    process failed (they count as not solved). Medians of env steps and time
    to target are over all runs, an unsolved one counting as infinitely slow,
    so a median exists only while more than half the seeds solved (with an even
    count, the upper middle one must have solved too). The median final return
    is over the runs that finished.
    """
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(r["label"], []).append(r)
    rows = []
    for label, rs in groups.items():
        done = [r for r in rs if r.get("status", "ok") == "ok"]
        finals = [r["final_return"] for r in done if r.get("final_return") is not None]
        rows.append({"config": label, "target": rs[0].get("target_return"), "runs": len(rs),
                     "seeds": sorted(r["seed"] for r in rs),
                     "solved": sum(bool(r.get("reached")) for r in rs), "failed": len(rs) - len(done),
                     "ended_at_target": sum(bool(r.get("ended_at_target")) for r in rs),
                     "median_env_steps_to_target": median_to_target([r.get("env_steps_to_target") for r in rs]),
                     "median_time_to_target_s": median_to_target([r.get("time_to_target_s") for r in rs]),
                     "median_final_return": float(np.median(finals)) if finals else None})
    return rows


def suite_markdown_table(rows: Sequence[Dict[str, Any]]) -> str:
    """The suite table; ``-``: no median (half or more of the seeds did not reach the target)."""
    header = ["config", "target", "solved", "median env steps to target", "median time to target (s)",
              "median final return", "final >= target"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        solved = f"{r['solved']}/{r['runs']}" + (f" ({r['failed']} failed)" if r["failed"] else "")
        cells = [r["config"], _fmt(r["target"], "g"), solved, _fmt(r["median_env_steps_to_target"], ",.0f"),
                 _fmt(r["median_time_to_target_s"], ".1f"), _fmt(r["median_final_return"], ".1f"),
                 f"{r['ended_at_target']}/{r['runs']}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_suite_curves(label: str, records: Sequence[Dict[str, Any]], path: str, points: int = 100) -> None:
    """PNG of one config: median evaluation return and min-max band over seeds, vs env steps and vs wall time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curves_ = [np.array(r["curve"], float) for r in records if r.get("curve")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, col, xlabel in ((axes[0], 0, "env steps"), (axes[1], 1, "wall-clock seconds (from process start)")):
        if curves_:
            grid, mid, lo, hi = band_on_grid([c[:, col] for c in curves_], [c[:, 2] for c in curves_], points,
                                             center="median")
            line, = ax.plot(grid, mid, label=f"median of {len(curves_)}", marker="o", markersize=2,
                            markevery=max(1, len(grid) // 20))
            ax.fill_between(grid, lo, hi, alpha=0.25, color=line.get_color(), label="min-max")
        else:
            ax.text(0.5, 0.5, "no evaluations", ha="center", va="center", transform=ax.transAxes)
        if records and records[0].get("target_return") is not None:
            ax.axhline(records[0]["target_return"], color="gray", ls="--", lw=1, label="target")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("evaluation return")
        ax.grid(alpha=0.3)
    axes[0].legend()
    solved = sum(bool(r.get("reached")) for r in records)
    import textwrap
    fig.suptitle(textwrap.fill(f"{label}: median and min-max over {len(records)} seed(s), "
                               f"{solved}/{len(records)} solved", 110), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_suite_report(records: Sequence[Dict[str, Any]], out_dir: str, title: str = "Learning suite",
                       notes: Sequence[str] = ()) -> Dict[str, Any]:
    """Write ``out_dir/learning-suite.md`` (table, notes, plots) and one ``<config>.png`` per config label."""
    os.makedirs(out_dir, exist_ok=True)
    rows = suite_rows(records)
    files = []
    for row in rows:
        path = os.path.join(out_dir, f"{_slug(row['config'])}.png")
        plot_suite_curves(row["config"], [r for r in records if r["label"] == row["config"]], path)
        files.append(path)
    table = suite_markdown_table(rows)
    md = [f"# {title}", "", table, "",
          "Medians count a run that did not reach its target as infinitely slow (`-`: half or more did not). "
          "Final return: the best evaluated policy, re-evaluated at the actors' precision.", ""]
    md += [f"- {n}" for n in notes] + [""] + [f"![{os.path.basename(f)}]({os.path.basename(f)})" for f in files]
    md_path = os.path.join(out_dir, "learning-suite.md")
    with open(md_path, "w") as f:
        f.write("\n".join(md) + "\n")
    return {"rows": rows, "table": table, "files": files + [md_path]}
