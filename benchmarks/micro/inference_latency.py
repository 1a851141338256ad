"""Actor inference latency: TF fp32 vs LiteRT fp32 / int8-dynamic / int8-full.

Median wall time of one policy call at batch 1 and 32, one thread everywhere,
for the CartPole Q-network (4 -> 256x256 -> 2) and ActorQ's policy MLP
(64 -> 3x2048 -> 18). LiteRT is timed through ``LiteRTPolicy.__call__``, i.e.
what an actor pays per step (input copy, invoke, output copy). The ratio
column is the speedup over LiteRT fp32 (> 1 is faster).

Usage::

    python -m benchmarks.micro.inference_latency                 # both nets, ~1 min
    python -m benchmarks.micro.inference_latency --nets cartpole --seconds 0.2 --out lat.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

NETS = {"cartpole": (4, (256, 256), 2), "actorq": (64, (2048,) * 3, 18)}
METHODS = ("tf-fp32", "litert-fp32", "litert-int8-dynamic", "litert-int8-full")
BATCHES = (1, 32)


def median_us(fn, seconds: float, min_reps: int = 20) -> float:
    """Median of single-call times (us) over ~``seconds`` of calls, after warm-up."""
    for _ in range(5):
        fn()
    times, deadline = [], time.perf_counter() + seconds
    while len(times) < min_reps or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def bench_net(name: str, seconds: float) -> list[dict]:
    import tensorflow as tf
    from core.networks import mlp
    from core.policy import LiteRTPolicy
    from core.quantize import PolicyQuantizer

    obs_dim, hidden, out_dim = NETS[name]
    model = mlp(obs_dim, hidden, out_dim, name=name, seed=0)
    rng = np.random.default_rng(0)
    calibration = rng.normal(size=(256, obs_dim)).astype(np.float32)
    payloads = {p: PolicyQuantizer(p).quantize(model, version=0, calibration_obs=calibration)
                for p in ("fp32", "int8-dynamic", "int8-full")}
    tf_call = tf.function(lambda x: model(x, training=False))
    rows = []
    for batch in BATCHES:
        obs = rng.normal(size=(batch, obs_dim)).astype(np.float32)
        obs_tf = tf.constant(obs)
        timings = {"tf-fp32": median_us(lambda: tf_call(obs_tf).numpy(), seconds)}
        for precision, payload in payloads.items():
            policy = LiteRTPolicy(payload, batch_size=batch, num_threads=1)
            timings[f"litert-{precision}"] = median_us(lambda: policy(obs), seconds)
        base = timings["litert-fp32"]
        rows += [{"net": name, "batch": batch, "method": m, "median_us": round(timings[m], 2),
                  "speedup_vs_litert_fp32": round(base / timings[m], 3)} for m in METHODS]
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'net':9s} {'batch':>5s} {'method':22s} {'median us':>11s} {'x vs LiteRT fp32':>17s}")
    for r in rows:
        print(f"{r['net']:9s} {r['batch']:5d} {r['method']:22s} {r['median_us']:11.1f} "
              f"{r['speedup_vs_litert_fp32']:17.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", choices=sorted(NETS), default=["cartpole", "actorq"])
    parser.add_argument("--seconds", type=float, default=1.0, help="timing budget per cell")
    parser.add_argument("--out", help="also write the rows as JSON to this path")
    args = parser.parse_args(argv)
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rows = [row for net in args.nets for row in bench_net(net, args.seconds)]
    print_table(rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
