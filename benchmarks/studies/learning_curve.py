"""Learning curves of one run or of several (seeds): greedy evaluations and training-episode returns vs env steps.

Reads ``metrics.jsonl`` of each run directory, finished or still running:
the ``eval`` records (greedy evaluations of policy versions) and the
``commit`` records (episodes that ended in each committed block and their
return sum, pooled per ``--window`` env steps by
:func:`benchmarks.studies.suite_report.training_curve`). Prints a markdown table per run
and, with ``--out``, plots every run's curves on one PNG (one colour per run:
evaluations as markers with their std, training windows as a line).
``--json`` writes one run's curves, or ``{"runs": [...]}`` for several.

Usage::

    python -m benchmarks.studies.learning_curve runs/pong-r2d2 --window 50000 \
        --out benchmarks/results/pong-r2d2-curve.png --json benchmarks/results/pong-r2d2-curve.json
    python -m benchmarks.studies.learning_curve runs/catch-s0 runs/catch-s1 runs/catch-s2 --window 2000 --out catch.png
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Optional, Sequence

from pipelines.cli import cli_errors


def curve_table(training: Sequence[Dict[str, Any]], evals: Sequence[Dict[str, Any]], window: int) -> str:
    """Markdown: per window, the training episodes' mean return and the evaluations planned inside it."""
    rows = ["| env steps (window end) | training episodes | training mean return | greedy evaluations in the window "
            "(env steps: mean +- std) |", "|---|---|---|---|"]
    for w in training:
        inside = [e for e in evals if w["env_steps"] - window < e["step"] <= w["env_steps"]]
        ev = "; ".join(f"{e['step']:,}: {e['mean']:.1f} +- {e['std']:.1f}" for e in inside) or "-"
        mean = "-" if w["mean_return"] is None else f"{w['mean_return']:.2f}"
        rows.append(f"| {w['env_steps']:,} | {w['episodes']} | {mean} | {ev} |")
    return "\n".join(rows)


def plot(runs: Sequence[Dict[str, Any]], title: str, path: str) -> None:
    """Every run's training windows (line) and greedy evaluations (markers with std), one colour per run.

    With several runs the legend names the runs, the evaluation markers of runs at the same env step are
    spread a little apart so their error bars stay readable, and a note says which mark is which.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    many = len(runs) > 1
    last = max([e["step"] for run in runs for e in run["evals"]] + [w["env_steps"] for run in runs
                                                                     for w in run["training"]] + [1])
    for i, run in enumerate(runs):
        colour = f"C{i}"
        pts = [w for w in run["training"] if w["mean_return"] is not None]
        ax.plot([w["env_steps"] for w in pts], [w["mean_return"] for w in pts], "o-", ms=3, color=colour,
                alpha=0.6 if many else 1.0,
                label=run["label"] if many else "training episodes (mean per window, exploring actors)")
        if run["evals"]:
            shift = (i - (len(runs) - 1) / 2) * 0.006 * last if many else 0.0
            ax.errorbar([e["step"] + shift for e in run["evals"]], [e["mean"] for e in run["evals"]],
                        yerr=[e["std"] for e in run["evals"]], fmt="s", ms=4, capsize=3, color=colour,
                        label=None if many else "greedy evaluation (mean +- std)")
    if many:
        ax.text(0.99, 0.02, "lines: training episodes (mean per window, exploring actors)\n"
                "squares: greedy evaluations (mean +- std)", transform=ax.transAxes, ha="right", va="bottom",
                fontsize=8, color="0.3")
    ax.set_xlabel("env steps (agent steps)")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_curve(run_dir: str, window: int) -> Dict[str, Any]:
    """One run's config, evaluations (one per planned step: a resumed run evaluates again) and training windows."""
    from core.config import ConfigError
    from core.metrics import read_metrics
    from benchmarks.studies.suite_report import training_curve
    records = read_metrics(run_dir)
    if not records:
        raise ConfigError(f"{run_dir!r} has no metrics.jsonl records; pass a directory written by "
                          f"python -m pipelines.train")
    config = next((r["config"] for r in records if r["kind"] == "config"), {})
    evals = sorted({r["step"]: r for r in records if r["kind"] == "eval"}.values(), key=lambda r: r["step"])
    keep = ("step", "version", "mean", "std", "min", "confirmed_mean", "wall_s")
    return {"run_dir": run_dir, "config": config, "window": window,
            "training": training_curve([r for r in records if r["kind"] == "commit"], window),
            "evals": [{k: e.get(k) for k in keep} for e in evals]}


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    from core.config import ConfigError
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.learning_curve",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", metavar="RUN_DIR", nargs="+",
                   help="run directories (local paths or URLs), finished or running: several (seeds of one config) "
                        "are tabled one after another and plotted on one figure")
    p.add_argument("--window", type=int, default=50_000, help="env steps pooled per training-return point")
    p.add_argument("--out", metavar="PNG", help="also plot the curves (every run's) to this PNG")
    p.add_argument("--json", metavar="PATH", help="also write the evaluations and training windows as JSON "
                   "(one run's, or {\"runs\": [...]} for several)")
    args = p.parse_args(argv)
    if args.window <= 0:
        raise ConfigError(f"--window {args.window}; valid: > 0 env steps")
    runs = [read_curve(d, args.window) for d in args.run_dirs]
    for run in runs:
        run["label"] = f"seed {run['config'].get('seed')}"
        if len(runs) > 1:
            print(f"\n{run['run_dir']} ({run['label']})\n")
        print(curve_table(run["training"], run["evals"], args.window))
    if args.json:
        import json
        keep = ("run_dir", "config", "window", "training", "evals")
        stored = [{k: run[k] for k in keep} for run in runs]
        with open(args.json, "w") as f:
            json.dump(stored[0] if len(stored) == 1 else {"runs": stored}, f, indent=1)
        print(f"wrote {args.json}")
    if args.out:
        config = runs[0]["config"]
        seeds = ", ".join(str(run["config"].get("seed")) for run in runs)
        title = f"{config.get('name', runs[0]['run_dir'])}: {config.get('env', {}).get('id', '')} " \
                f"{config.get('agent', {}).get('algo', '')}, seed{'s' if len(runs) > 1 else ''} {seeds}"
        plot(runs, title, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
