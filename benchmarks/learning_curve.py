"""One run's learning curve: greedy evaluations and training-episode returns vs env steps.

Reads ``metrics.jsonl`` of a run directory, finished or still running: the
``eval`` records (greedy evaluations of policy versions) and the ``commit``
records (episodes that ended in each committed block and their return sum,
pooled per ``--window`` env steps by :func:`core.report_suite.training_curve`).
Prints a markdown table and, with ``--out``, plots both curves to a PNG.

Usage::

    python -m benchmarks.learning_curve runs/pong-r2d2 --window 50000 --out benchmarks/results/pong-r2d2-curve.png \
        --json benchmarks/results/pong-r2d2-curve.json
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


def plot(training: Sequence[Dict[str, Any]], evals: Sequence[Dict[str, Any]], title: str, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    pts = [w for w in training if w["mean_return"] is not None]
    ax.plot([w["env_steps"] for w in pts], [w["mean_return"] for w in pts], "o-", ms=3,
            label="training episodes (mean per window, exploring actors)")
    if evals:
        ax.errorbar([e["step"] for e in evals], [e["mean"] for e in evals], yerr=[e["std"] for e in evals],
                    fmt="s", ms=4, capsize=3, label="greedy evaluation (mean +- std)")
    ax.set_xlabel("env steps (agent steps)")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    from core.config import ConfigError
    from core.metrics import read_metrics
    from core.report_suite import training_curve
    p = argparse.ArgumentParser(prog="python -m benchmarks.learning_curve", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (local path or URL), finished or running")
    p.add_argument("--window", type=int, default=50_000, help="env steps pooled per training-return point")
    p.add_argument("--out", metavar="PNG", help="also plot the curves to this PNG")
    p.add_argument("--json", metavar="PATH", help="also write the evaluations and training windows as JSON")
    args = p.parse_args(argv)
    if args.window <= 0:
        raise ConfigError(f"--window {args.window}; valid: > 0 env steps")
    records = read_metrics(args.run_dir)
    if not records:
        raise ConfigError(f"{args.run_dir!r} has no metrics.jsonl records; pass a directory written by "
                          f"python -m pipelines.train")
    config = next((r["config"] for r in records if r["kind"] == "config"), {})
    # A resumed run evaluates the planned evaluations after its checkpoint again: one per planned step, the last.
    evals = sorted({r["step"]: r for r in records if r["kind"] == "eval"}.values(), key=lambda r: r["step"])
    training = training_curve([r for r in records if r["kind"] == "commit"], args.window)
    print(curve_table(training, evals, args.window))
    if args.json:
        import json
        keep = ("step", "version", "mean", "std", "min", "confirmed_mean", "wall_s")
        with open(args.json, "w") as f:
            json.dump({"run_dir": args.run_dir, "config": config, "window": args.window, "training": training,
                       "evals": [{k: e.get(k) for k in keep} for e in evals]}, f, indent=1)
        print(f"wrote {args.json}")
    if args.out:
        title = f"{config.get('name', args.run_dir)}: {config.get('env', {}).get('id', '')} " \
                f"{config.get('agent', {}).get('algo', '')}, seed {config.get('seed')}"
        plot(training, evals, title, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
