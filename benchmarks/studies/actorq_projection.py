"""A projection, labelled as one: predicted whole-run int8 speedup vs the actor share of wall time.

From measured costs (``python -m benchmarks.studies.actorq_costs --out COSTS``, fp32
and an int8 precision) this plots what :mod:`benchmarks.studies.actorq_model` predicts
beyond this machine, with measured runs overlaid:

* left: speedup against the actor share ``f`` of an fp32 run's time, for the
  two limits of the model: serial (Amdahl, ``1 / ((1 - f) + f / s)``) and
  pipelined (actors and learner overlap, ``max(f, 1 - f) / max(f / s, 1 - f)``),
  ``s`` = the measured int8 actor speedup (parallel rollouts per env step);
  the config of ``COSTS`` is marked there at K = 1, 10, 100 (learner K x faster
  on an accelerator) and with N = 2, 8, 32 actor cores;
* right: the model's steady-state speedup of that config against K, one curve
  per N (actor cores, each running one actor process; the learner on its own).

Usage::

    python -m benchmarks.studies.actorq_projection --costs benchmarks/results/actorq-costs-cartpole.json \\
        --validation benchmarks/results/actorq-validation.json --out benchmarks/results/actorq-projection.png
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from benchmarks.studies.actorq_model import steady_bounds


def amdahl(f: np.ndarray, s: float) -> np.ndarray:
    """Serial limit: actors and learner take turns."""
    return 1.0 / ((1.0 - f) + f / s)


def pipelined(f: np.ndarray, s: float) -> np.ndarray:
    """Overlapped limit: the slower side sets the pace."""
    return np.maximum(f, 1.0 - f) / np.maximum(f / s, 1.0 - f)


def _actor_step(c: Dict[str, Any]) -> float:
    """Actor wall per env step of one actor process (parallel measurement where there is one)."""
    return (c.get("rollout_parallel") or c["rollout"])["wall_s"]


def scenario(costs: Dict[str, Any], s: Dict[str, Any], precision: str, k: float, n: int) -> Dict[str, float]:
    """Steady-state speedup of ``precision`` over fp32 and fp32's actor share, learner K x faster, N actor cores.

    Each actor core runs one actor process; the learner has cores of its own
    (so the CPU bound does not apply); policy versions are published off the
    learner's path (as an accelerator learner would, ``AsyncQuantizer``), so only
    the actors differ between precisions; per-step costs are this machine's.
    """
    lrn = dict(costs["learner"], wall_s=costs["learner"]["wall_s"] / k, cpu_s=costs["learner"]["cpu_s"] / k)
    setting = dict(s, workers=n, num_actors=max(n, s["num_actors"]), cores=10 ** 9)
    rates, bounds = {}, {}
    for p in ("fp32", precision):
        c = dict(costs["precisions"][p])
        c["rollout"] = dict(c["rollout"], wall_s=_actor_step(c))
        # Versions published off the learner's path (core.quantize.AsyncQuantizer): only actors differ.
        c["version"] = dict(c["version"], patch_s=0.0, patch_cpu_s=0.0, convert_s=0.0, convert_cpu_s=0.0,
                            bcast_s=0.0, bcast_cpu_s=0.0, load_cpu_s=0.0)
        bounds[p] = steady_bounds(c, costs["storage"], lrn, setting)
        rates[p] = min(bounds[p]["actors"], bounds[p]["learner"])
    # fp32's time per env step on each side: actors (parallel), the learner's path (steps, commit, versions)
    a, learn = 1.0 / bounds["fp32"]["actors"], 1.0 / bounds["fp32"]["learner"]
    return {"speedup": rates[precision] / rates["fp32"], "actor_share": a / (a + learn)}


def measured_points(validation: Optional[Dict[str, Any]], precision: str) -> List[Tuple[float, float, str]]:
    """(fp32 actor share of wall, measured speedup, label) of validation settings run at fp32 and ``precision``."""
    if not validation:
        return []
    rows = {(r["name"], r["precision"]): r for r in validation["rows"] if "measured_env_steps_per_s" in r}
    out = []
    for (name, p), r in rows.items():
        base = rows.get((name, "fp32"))
        if p != precision or base is None:
            continue
        sh = base["wall_split"]["share"]
        f = sh["actors"] / max(sh["actors"] + sh["learner"], 1e-9)
        out.append((f, r["measured_env_steps_per_s"] / base["measured_env_steps_per_s"], name))
    return out


def plot(costs: Dict[str, Any], s: Dict[str, Any], precision: str, points: Sequence[Tuple[float, float, str]],
         path: str, note: str) -> Dict[str, Any]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    speed = _actor_step(costs["precisions"]["fp32"]) / _actor_step(costs["precisions"][precision])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.6))
    f = np.linspace(0.0, 1.0, 201)
    ax.plot(f, amdahl(f, speed), label=f"serial (Amdahl), actor speedup s={speed:.2f}x")
    ax.plot(f, pipelined(f, speed), "--", label="pipelined (actors overlap the learner)")
    marks = {}
    for k, n, m in [(1, 2, "o"), (10, 2, "s"), (100, 2, "^"), (1, 8, "D"), (1, 32, "v"), (100, 32, "P")]:
        sc = scenario(costs, s, precision, k, n)
        marks[f"K={k} N={n}"] = sc
        ax.plot(sc["actor_share"], sc["speedup"], m, color="k", ms=7, label=f"this config, learner {k}x, {n} actor cores")
    for x, y, name in points:
        ax.plot(x, y, "*", color="tab:red", ms=13)
        ax.annotate(f"measured: {name}", (x, y), textcoords="offset points", xytext=(5, 5), fontsize=7,
                    color="tab:red")
    ax.set_xlabel("actor share of fp32 wall time  (actor time / (actor + learner time) per env step)")
    ax.set_ylabel(f"predicted whole-run speedup, {precision} vs fp32")
    ax.set_title("PROJECTION from costs measured on this machine")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    ks = np.logspace(0, 3, 61)
    for n in (2, 8, 32, 128):
        bx.plot(ks, [scenario(costs, s, precision, k, n)["speedup"] for k in ks], label=f"N={n} actor cores")
    bx.set_xscale("log")
    bx.set_xlabel("learner K x faster than this machine's 1-thread CPU learner (accelerator)")
    bx.set_ylabel(f"predicted steady-state speedup, {precision} vs fp32")
    bx.set_title(f"config: replay ratio {s['replay_ratio']}, batch {s.get('batch_size')}, "
                 f"{s['num_envs']} envs per actor", fontsize=9)
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3, which="both")
    fig.text(0.01, 0.005, note, fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    fig.savefig(path, dpi=110)
    return {"actor_speedup": speed, "marks": marks}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--costs", required=True, help="an actorq_costs --out JSON with fp32 and --precision")
    ap.add_argument("--validation", help="an actorq_validate --out JSON (measured points)")
    ap.add_argument("--precision", default="int8-dynamic")
    ap.add_argument("--point", action="append", default=[], metavar="SHARE,SPEEDUP,LABEL",
                    help="another measured point (e.g. a study's fp32 actor share and int8 throughput ratio)")
    ap.add_argument("--out", required=True, help="PNG path")
    args = ap.parse_args(argv)
    with open(args.costs) as f:
        record = json.load(f)
    if args.precision not in record["costs"]["precisions"] or "fp32" not in record["costs"]["precisions"]:
        print(f"error: --costs {args.costs!r} lacks fp32 or {args.precision}; valid: a file measured with both",
              file=sys.stderr)
        return 2
    validation = None
    if args.validation:
        with open(args.validation) as f:
            validation = json.load(f)
    note = ("PROJECTION. Assumptions: per-step costs measured on this machine (" + record.get("measured_at", "?") +
            f", load {record['load_average'][0]:.1f}); steady state (no start-up, warm-up, evaluation);\n"
            "the learner is K x faster per step and runs beside N single-thread actor processes on cores of their "
            "own; commits stay on the learner's path; policy versions are published off it (async quantizer); "
            "shard writes as measured; no network or memory-bandwidth limits.\n"
            "Actor share = fp32 actor time / (actor + learner-path time) per env step. Measured points (red): "
            "runs at both precisions, x from the fp32 run's wall_split (actors / (actors + learner)), y = env steps/s ratio.")
    points = measured_points(validation, args.precision)
    for item in args.point:
        try:
            share, speedup, label = item.split(",", 2)
            points.append((float(share), float(speedup), label))
        except ValueError:
            print(f"error: --point {item!r} is not SHARE,SPEEDUP,LABEL; valid: e.g. 0.04,0.95,study r0.03",
                  file=sys.stderr)
            return 2
    out = plot(record["costs"], record["setting"], args.precision, points, args.out, note)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
