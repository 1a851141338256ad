"""The learning-suite report: one JSON record per run, one row and one plot per config (configs x seeds).

``benchmarks/studies/learning_suite.py`` runs the shipped configs for several seeds;
:func:`suite_record` turns a finished run directory into one JSON record
(summary fields, plus the evaluation curve and best confirmed return from
``metrics.jsonl``); :func:`suite_rows` aggregates records per config label
(solved k/N, medians of env steps and time to target with an unsolved run
counted as infinitely slow, median final return); :func:`plot_suite_curves`
draws the median and min-max band over seeds
(:func:`core.report.format.band_on_grid`).

Example::

    records = [dict(suite_record(d), label="configs/default.yaml", seed=s) for s, d in enumerate(dirs)]
    rows = suite_rows(records)             # one row per label
    write_suite_report(records, "suite/")  # learning-suite.md, configs-default-yaml.png
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from core.report.format import _fmt, _slug, band_on_grid
from core.report.runs import load_run


def first_hit(evals: Sequence[Dict[str, Any]], target: float, confirm_episodes: int) -> Optional[Dict[str, Any]]:
    """The first evaluation that counts as solved (the rule of ``pipelines.run.summary.record_target``).

    Solved: the confirmed mean (or, with ``confirm_episodes == 0``, the mean)
    is at or above ``target``. Returns that ``eval`` record, or None.
    """
    for e in sorted(evals, key=lambda e: e["step"]):
        score = e.get("confirmed_mean") if e.get("confirmed_mean") is not None else e["mean"]
        if score >= target and (e.get("confirmed_mean") is not None or confirm_episodes == 0):
            return e
    return None


def training_curve(commits: Sequence[Dict[str, Any]], window: int) -> List[Dict[str, Any]]:
    """Training-episode returns per ``window`` committed env steps, from ``commit`` records.

    Each ``commit`` record (``pipelines.run.block_tasks``) carries the env steps
    committed so far (``step``), the episodes that ended in its block and
    their ``return_sum``. Blocks are pooled into windows by the env steps they
    end at, ``(k - 1) * window < step <= k * window``; a window's return is its
    episodes' mean (None without an episode). Records without ``episodes``
    (runs before it was logged) are skipped. Returns one
    ``{"env_steps": k * window, "episodes", "mean_return"}`` per window that
    holds a block, in order.
    """
    if window <= 0:
        raise ValueError(f"window {window}; valid: > 0 env steps")
    pooled: Dict[int, List[float]] = {}
    for c in commits:
        if "episodes" not in c:
            continue
        k = max(1, -(-int(c["step"]) // window))
        n, total = pooled.setdefault(k, [0, 0.0])
        pooled[k] = [n + int(c["episodes"]), total + float(c["return_sum"])]
    return [{"env_steps": k * window, "episodes": n, "mean_return": total / n if n else None}
            for k, (n, total) in sorted(pooled.items())]


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
