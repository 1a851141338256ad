"""Learner steps/s of each learner code path, side by side in one run, on the default and ActorQ networks.

The DQN learner's K-step loop (``core.agents.dqn.learning``) can run four
ways, chosen by ``agent.fused_adam`` and ``agent.jit_compile``:

    keras      Keras Adam's apply_gradients in a tf.function loop (the code path before issue 33)
    fused      one ResourceApplyAdam per variable (core.agents.fused_adam)
    xla        Keras Adam, the loop XLA-compiled for this CPU
    fused+xla  both

Each path trains a fresh learner on the same synthetic ``[K, B]`` n-step
batches (``K = learner.steps_per_call``, as the learner stage calls it;
host arrays, so the host->TF copy is timed too). Paths alternate within
every round and the median round is reported, so a change of machine load
hits every path alike. TensorFlow fixes its thread pools at its first op, so
each ``--threads`` value runs in a process of its own. The first call of a
path (tracing, and compiling with XLA) is reported apart, as ``first_s``.
The machine line says whether the CPU has ``avx512_bf16``/``amx_bf16``: without
them oneDNN's bf16 matmuls are emulated and slower, so bf16 is no lever. With
them, ``--precision fp32,bf16`` also runs every path with TensorFlow's oneDNN
auto mixed precision (``auto_mixed_precision_onednn_bfloat16``: the graph's
matmuls in bf16, variables and Adam in fp32), in a process of its own.

The roof table puts each network's step beside this core's matmul speed at the
same precision and threads (:mod:`benchmarks.micro.learner_roof`): the step's
matmul FLOPs over the measured ``[B, h] x [h, h]`` rate is the fastest a step
could be if nothing but its matmuls cost time, so ``keras / roof`` is the
ceiling on any learner speed-up at that precision.

Example::

    python benchmarks/micro/learner_speed.py                       # both networks, 1 thread, 3 rounds
    python benchmarks/micro/learner_speed.py --threads 1,2 --rounds 5 --json benchmarks/results/learner-speed.json
    python benchmarks/micro/learner_speed.py --networks default --paths keras,fused --seconds 2
    python benchmarks/micro/learner_speed.py --networks default --paths fused,fused+xla --hidden 8,8   # dispatch alone
    python benchmarks/micro/learner_speed.py --paths keras,fused --precision fp32,bf16   # bf16 hardware only
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.common import REPO, git_state, machine_info  # noqa: E402

NETWORKS = {"default": "configs/default.yaml", "actorq": "configs/actorq/cartpole-dqn.yaml"}
PATHS = {"keras": {"fused_adam": False, "jit_compile": False}, "fused": {"fused_adam": True, "jit_compile": False},
         "xla": {"fused_adam": False, "jit_compile": True}, "fused+xla": {"fused_adam": True, "jit_compile": True}}
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
PRECISIONS = ("fp32", "bf16")


def cpu_flags() -> List[str]:
    """This CPU's bf16-relevant flags from /proc/cpuinfo (empty: no bf16 hardware)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if f in BF16_FLAGS or f.startswith("avx512f") or f == "avx2")


def synthetic_batches(spec, k: int, b: int, count: int = 4) -> List[Dict]:
    """``count`` fixed ``[k, b]`` n-step batches shaped like NStepSampler's (seeded: every path sees the same)."""
    import numpy as np
    rng = np.random.default_rng(0)
    return [{"observation": rng.standard_normal((k, b, spec.obs_dim)).astype(np.float32),
             "next_observation": rng.standard_normal((k, b, spec.obs_dim)).astype(np.float32),
             "action": rng.integers(spec.num_actions, size=(k, b)), "reward": rng.random((k, b), np.float32),
             "discount": np.full((k, b), 0.99 ** 3, np.float32), "weight": np.ones((k, b), np.float32)}
            for _ in range(count)]


def time_path(learner, batches, seconds: float) -> float:
    """Learner steps/s over at least ``seconds`` (whole calls; at least two)."""
    k = batches[0]["reward"].shape[0]
    calls, t0 = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - t0 < seconds:
        learner.step(batches[calls % len(batches)])
        calls += 1
    return calls * k / (time.perf_counter() - t0)


def worker(args) -> Dict:
    """One process, one thread count: every network x path, alternating within each round."""
    import dataclasses
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()     # as the learner stage runs it
    if args.precision == "bf16":      # oneDNN's graph rewrite: matmuls in bf16, variables and Adam in fp32
        tf.config.optimizer.set_experimental_options({"auto_mixed_precision_onednn_bfloat16": True})
    from benchmarks.micro.learner_roof import dqn_step_flops, matmul_gflops
    from core.agents.dqn.learning import DQNLearner
    from core.config import load_config
    from core.envs import env_spec
    out: Dict = {}
    for net in args.networks:
        cfg = load_config(os.path.join(REPO, NETWORKS[net]))
        if args.hidden:    # another width (e.g. 8,8: the step's op dispatch with next to no arithmetic)
            cfg.agent = dataclasses.replace(cfg.agent, hidden=[int(h) for h in args.hidden.split(",")])
        spec = env_spec(cfg.env.id)
        k = args.k or (cfg.learner.steps_per_call if net == "default" else 2)
        batches = synthetic_batches(spec, k, cfg.agent.batch_size)
        learners, rows = {}, {p: {"steps_per_s": []} for p in args.paths}
        for p in args.paths:
            learners[p] = DQNLearner(spec, dataclasses.replace(cfg.agent, **PATHS[p]), seed=0)
            t0 = time.perf_counter()
            learners[p].step(batches[0])
            rows[p]["first_s"] = time.perf_counter() - t0
        for _ in range(args.rounds):
            for p in args.paths:
                rows[p]["steps_per_s"].append(time_path(learners[p], batches, args.seconds))
        roof = {"step_mflop": dqn_step_flops(spec.obs_dim, cfg.agent.hidden, spec.num_actions,
                                             cfg.agent.batch_size) / 1e6,
                "matmul_gflops": matmul_gflops(cfg.agent.batch_size, max(cfg.agent.hidden),
                                               "bfloat16" if args.precision == "bf16" else "float32")}
        out[net] = {"hidden": list(cfg.agent.hidden), "batch": cfg.agent.batch_size, "k": k, "paths": rows,
                    "roof": roof}
    return out


def table(results: Dict, base: str) -> str:
    """A markdown table: network, threads and precision, path, median steps/s, ms/step, ratio to ``base`` in the
    first process (the fewest threads, fp32)."""
    lines = ["| network | threads, precision | path | median steps/s | ms/step | vs old | first call s |",
             "|---|---|---|---|---|---|---|"]
    first = next(iter(results))
    for run, nets in results.items():
        for net, r in nets.items():
            ref = statistics.median(results[first][net]["paths"][base]["steps_per_s"]) \
                if base in results[first][net]["paths"] else None
            for p, row in r["paths"].items():
                med = statistics.median(row["steps_per_s"])
                ratio = f"{med / ref:.2f}x" if ref else "-"
                lines.append(f"| {net} {r['hidden']} b{r['batch']} K{r['k']} | {run} | {p} | {med:,.1f} | "
                             f"{1000 / med:.2f} | {ratio} | {row['first_s']:.2f} |")
    return "\n".join(lines)


def roof_table(results: Dict, base: str) -> str:
    """Each network's step against this core's matmul speed (module docstring): the ceiling on a speed-up."""
    lines = ["| network | threads, precision | step matmul MFLOP | matmul GFLOP/s | roof ms/step | fastest path ms/step "
             "(share of roof) | ceiling vs old |", "|---|---|---|---|---|---|---|"]
    first = next(iter(results))
    for run, nets in results.items():
        for net, r in nets.items():
            roof_ms = r["roof"]["step_mflop"] / r["roof"]["matmul_gflops"]
            fastest = min(1000 / statistics.median(row["steps_per_s"]) for row in r["paths"].values())
            old = results[first][net]["paths"].get(base)
            ceiling = f"{1000 / statistics.median(old['steps_per_s']) / roof_ms:.2f}x" if old else "-"
            lines.append(f"| {net} {r['hidden']} b{r['batch']} | {run} | {r['roof']['step_mflop']:.1f} | "
                         f"{r['roof']['matmul_gflops']:.1f} | {roof_ms:.3f} | {fastest:.3f} ({roof_ms / fastest:.0%}) | "
                         f"{ceiling} |")
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/micro/learner_speed.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[1:]))
    p.add_argument("--networks", default="default,actorq", help=f"comma list of {', '.join(NETWORKS)}")
    p.add_argument("--paths", default="keras,fused,xla,fused+xla", help=f"comma list of {', '.join(PATHS)}")
    p.add_argument("--threads", default="1", help="comma list of TF intra-op thread counts (default 1)")
    p.add_argument("--precision", default="fp32",
                   help="comma list of fp32, bf16 (oneDNN auto mixed precision; CPUs with avx512_bf16/amx_bf16 only)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per path per round (default 3)")
    p.add_argument("--k", type=int, default=0, help="steps per call (default: steps_per_call; 2 for actorq)")
    p.add_argument("--hidden", default="", help="comma list of hidden widths replacing each network's (default: its own)")
    p.add_argument("--json", help="also write the record here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.networks, args.paths = args.networks.split(","), args.paths.split(",")
    bad = [n for n in args.networks if n not in NETWORKS] + [x for x in args.paths if x not in PATHS] + \
        [x for x in args.precision.split(",") if x not in PRECISIONS] + \
        [h for h in args.hidden.split(",") if args.hidden and not (h.isdigit() and int(h) >= 1)]
    if bad or args.rounds < 1 or args.seconds <= 0 or args.k < 0:
        p.error(f"invalid {bad or 'number'}; valid: networks {', '.join(NETWORKS)}; paths {', '.join(PATHS)}; "
                f"precisions {', '.join(PRECISIONS)}; "
                "--rounds >= 1, --seconds > 0, --k >= 0, --hidden widths >= 1")
    if args.worker:
        args.threads = int(args.threads)
        print(json.dumps(worker(args)))
        return 0
    threads = [int(t) for t in args.threads.split(",")]
    machine = {**machine_info(), "cpu_flags": cpu_flags()}
    precisions = args.precision.split(",")
    if "bf16" in precisions and not any(f in BF16_FLAGS for f in machine["cpu_flags"]):
        p.error("--precision bf16 needs a CPU with avx512_bf16 or amx_bf16 (oneDNN emulates bf16 elsewhere); "
                "this one has neither")
    results = {}
    for n, precision in [(n, x) for n in threads for x in precisions]:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--threads", str(n), "--precision", precision,
               "--networks",
               ",".join(args.networks), "--paths", ",".join(args.paths), "--rounds", str(args.rounds),
               "--seconds", str(args.seconds), "--k", str(args.k), "--hidden", args.hidden]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        if proc.returncode != 0:
            raise SystemExit(f"error: the {n}-thread {precision} worker failed: "
                             f"{proc.stderr.strip().splitlines()[-1:]}")
        results[f"{n}, {precision}"] = json.loads(proc.stdout.strip().splitlines()[-1])
    machine["loadavg_after"] = os.getloadavg()
    commit, dirty = git_state()
    bf16 = [f for f in machine["cpu_flags"] if f in BF16_FLAGS]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  {machine['cpu']}, {machine['cores']} cores, "
          f"load {machine['loadavg'][0]:.1f} -> {machine['loadavg_after'][0]:.1f}; bf16 hardware: "
          f"{', '.join(bf16) if bf16 else 'none (no avx512_bf16/amx_bf16: bf16 not measured)'}")
    print(table(results, base="keras"))
    print(roof_table(results, base="keras"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
                       "git_commit": commit, "git_dirty": dirty, "machine": machine, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
