"""The cluster-scale study's plot, from its record: env steps/s, scaling efficiency and central CPU against N.

The third panel shows the driver's and the scheduler's CPU per 1,000 env steps, their sum, and the idle
cluster's floor at each N's rate (its scheduler and client CPU per second over that N's env steps/s, when
the study measured one) with the sum less that floor: what the orchestration itself costs per env step.
A record written by ``benchmarks/studies/cluster_scale.py --out`` re-renders without running again::

    python benchmarks/studies/cluster_scale_plot.py benchmarks/results/cluster-scale.json \\
        benchmarks/results/cluster-scale.png
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional


def plot(records: List[Dict[str, Any]], path: str, title: str, idle_per_1k: Optional[List[float]] = None) -> None:
    """Three panels over N; ``idle_per_1k``: the idle floor in CPU s per 1,000 env steps at each record's N."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ns = [r["n_workers"] for r in records]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    axes[0].plot(ns, [r["env_steps_per_s"] for r in records], "o-", label="measured")
    one = records[0]["env_steps_per_s"] / records[0]["n_workers"]
    axes[0].plot(ns, [n * one for n in ns], "--", color="grey", label="N x one actor")
    axes[0].set(xscale="log", yscale="log", xlabel="actors N", ylabel="env steps/s")
    axes[1].plot(ns, [100 * (r["efficiency"] or 0) for r in records], "o-")
    axes[1].axhline(80, ls="--", color="grey")
    axes[1].set(xscale="log", ylim=(0, 110), xlabel="actors N", ylabel="scaling efficiency %")
    for key, label in (("driver_cpu_s_per_1k_steps", "driver"), ("scheduler_cpu_s_per_1k_steps", "scheduler"),
                       ("central_cpu_s_per_1k_steps", "driver + scheduler")):
        axes[2].plot(ns, [r[key] for r in records], "o-", label=label)
    if idle_per_1k:
        central = [r["central_cpu_s_per_1k_steps"] for r in records]
        axes[2].plot(ns, idle_per_1k, ":", color="grey", label="idle cluster's floor")
        axes[2].plot(ns, [max(c - i, 0.0) for c, i in zip(central, idle_per_1k)], "s--", color="black",
                     label="driver + scheduler less the floor")
    axes[2].set(xscale="log", ylim=(0, None), xlabel="actors N", ylabel="CPU s per 1,000 env steps")
    for ax in (axes[0], axes[2]):
        ax.legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(ns, [str(n) for n in ns])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def title(record: Dict[str, Any]) -> str:
    """The plot's title from a study record."""
    block_rows = record["records"][0]["block_rows"]
    machine = record["machine"]
    return (f"cluster scale: {record['env_id']}, {block_rows}-row blocks, learner {record['learner']} on the "
            f"{record['learner_host']}; {machine['cpu']}, {machine['cores']} cores")


def plot_record(record: Dict[str, Any], path: str) -> None:
    floor = record["projection"].get("idle_floor")
    plot(record["records"], path, title(record),
         record["projection"]["idle_floor_cpu_s_per_1k_steps"] if floor else None)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/studies/cluster_scale_plot.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("record", help="a record of benchmarks/studies/cluster_scale.py (its --out JSON)")
    p.add_argument("png", help="where the plot goes")
    args = p.parse_args(argv)
    try:
        with open(args.record) as f:
            record = json.load(f)
        plot_record(record, args.png)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        p.error(f"{args.record} is not a cluster-scale record: {type(e).__name__}: {e}")
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
