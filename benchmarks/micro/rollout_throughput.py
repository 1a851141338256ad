"""Rollout-stage env steps/s: fp32 vs int8 actors, and Dask with 1 vs 2 workers.

Part 1 runs the real rollout stage (``core.rollout.run_rollout_task``: 8
CartPole envs, LiteRT policy, epsilon-greedy) in this process with ActorQ's
3x2048 policy MLP at each precision, interleaving precisions over several
repeats, and prints env steps/s and the ratio to fp32 (goal: int8 >= 2.5x).

Part 2 runs the same rollout tasks on a Dask LocalCluster with 1 and then 2
single-threaded workers and prints the scaling ratio (goal: >= 1.8x).

    python benchmarks/micro/rollout_throughput.py              # both parts
    python benchmarks/micro/rollout_throughput.py --hidden 256 256 --part precision
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def make_payloads(hidden, precisions):
    import numpy as np
    from core.networks import mlp
    from core.quantize import PolicyQuantizer
    model = mlp(4, hidden, 2, name="q", seed=0)
    calib = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    return {p: PolicyQuantizer(p).quantize(model, version=1, calibration_obs=calib if p == "int8-full" else None)
            for p in precisions}


def rollout_rate(payload, run_id, tasks, steps, envs):
    from core.actor import ActorSpec
    from core.rollout import release_actors, run_rollout_task
    spec = ActorSpec(run_id, "CartPole-v1", envs, seed=0, actor_id=0)
    run_rollout_task(spec, payload, 0, 4, {"epsilon": 0.1})   # warm up: build envs + interpreter
    t0 = time.perf_counter()
    for k in range(1, tasks + 1):
        run_rollout_task(spec, payload, k, steps, {"epsilon": 0.1})
    rate = tasks * steps * envs / (time.perf_counter() - t0)
    release_actors(run_id)
    return rate


def part_precision(args):
    from pipelines.cli import print_table
    precisions = ["fp32", "int8-dynamic", "int8-full"]
    payloads = make_payloads(args.hidden, precisions)
    rates = {p: [] for p in precisions}
    for r in range(args.repeats):
        for p in precisions:
            rates[p].append(rollout_rate(payloads[p], f"bench-{p}-{r}", args.tasks, args.steps, args.envs))
    base = statistics.median(rates["fp32"])
    print(f"\nrollout stage, CartPole x{args.envs} envs, policy 4 -> {'x'.join(map(str, args.hidden))} -> 2, "
          f"median of {args.repeats}")
    print_table(["precision", "env steps/s", "vs fp32", "payload bytes"],
                [[p, f"{statistics.median(v):,.0f}", f"{statistics.median(v) / base:.2f}x",
                  f"{payloads[p].nbytes:,}"] for p, v in rates.items()])


def _dask_rate(n_workers, payload, args):
    from distributed import Client, LocalCluster, wait
    from core.actor import ActorSpec
    from core.rollout import run_rollout_task
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}) as cluster, Client(cluster) as c:
        ref = c.scatter(payload, broadcast=True)
        actors = args.actors_per_worker * n_workers
        specs = [ActorSpec("bench-dask", "CartPole-v1", args.envs, 0, a) for a in range(actors)]
        addrs = sorted(c.scheduler_info()["workers"])
        submit = lambda a, k: c.submit(run_rollout_task, specs[a], ref, k, args.steps, {"epsilon": 0.1},
                                       workers=[addrs[a % n_workers]], pure=False)
        wait([submit(a, 0) for a in range(actors)])    # warm up every actor
        t0 = time.perf_counter()
        futs = [submit(a, k) for k in range(1, args.tasks + 1) for a in range(actors)]
        wait(futs)
        return len(futs) * args.steps * args.envs / (time.perf_counter() - t0)


def part_dask(args):
    from pipelines.cli import print_table
    payload = make_payloads(args.hidden, ["int8-dynamic"])["int8-dynamic"]
    one, two = [], []
    for _ in range(args.repeats):
        one.append(_dask_rate(1, payload, args))
        two.append(_dask_rate(2, payload, args))
    print(f"\nDask rollout throughput, int8-dynamic policy 4 -> {'x'.join(map(str, args.hidden))} -> 2, "
          f"{args.actors_per_worker} actors per worker, {args.steps} steps x {args.envs} envs per task, "
          f"median of {args.repeats}")
    print_table(["workers", "env steps/s", "vs 1 worker"],
                [[1, f"{statistics.median(one):,.0f}", "1.00x"],
                 [2, f"{statistics.median(two):,.0f}", f"{statistics.median(two) / statistics.median(one):.2f}x"]])


def _inference_loop(payload, seconds, queue):
    import numpy as np
    from core.policy import LiteRTPolicy
    policy = LiteRTPolicy(payload, batch_size=8)
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        policy(x)
        n += 1
    queue.put(n / (time.perf_counter() - t0))


def part_ceiling(args):
    """The machine's own scaling for this work: 2 independent processes vs 1 (no Dask)."""
    import multiprocessing as mp
    from pipelines.cli import print_table
    payload = make_payloads(args.hidden, ["int8-dynamic"])["int8-dynamic"]
    ctx = mp.get_context("spawn")
    rates = {1: [], 2: []}
    for _ in range(args.repeats):
        for n in (1, 2):
            q = ctx.Queue()
            procs = [ctx.Process(target=_inference_loop, args=(payload, 4.0, q)) for _ in range(n)]
            for p in procs:
                p.start()
            rates[n].append(sum(q.get() for _ in procs))
            for p in procs:
                p.join()
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    print(f"\nhardware ceiling: LiteRT int8 inference loop, 1 vs 2 processes, median of {args.repeats}")
    print_table(["processes", "calls/s", "vs 1"], [[1, f"{one:,.0f}", "1.00x"], [2, f"{two:,.0f}", f"{two / one:.2f}x"]])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["precision", "dask", "ceiling", "all"], default="all")
    p.add_argument("--hidden", type=int, nargs="+", default=[2048, 2048, 2048], help="policy MLP widths")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=64, help="vector steps per task")
    p.add_argument("--tasks", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--actors-per-worker", type=int, default=2, help="Dask part: concurrent actors per worker")
    args = p.parse_args()
    if args.part in ("precision", "all"):
        part_precision(args)
    if args.part in ("dask", "all"):
        part_dask(args)
    if args.part in ("ceiling", "all"):
        part_ceiling(args)


if __name__ == "__main__":
    main()
