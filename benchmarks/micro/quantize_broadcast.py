"""Cost of one policy broadcast: produce the payload, its bytes, and the actor's load.

For each network and precision it reports, medians over ``--repeats``:

* ``convert s``: ``PolicyQuantizer.quantize`` (TFLiteConverter.from_keras_model);
* ``patch ms``: ``FlatbufferPatcher.patch`` (new weights into a prebuilt
  flatbuffer; fp32/fp16/int8-dynamic only; ``build s`` is its one-off conversion);
* ``submit ms``: ``AsyncQuantizer.submit``, what the learner thread pays when
  conversion runs in the background (a weight copy);
* ``bytes``: the payload (what is scattered to actors once per version);
* ``load ms``: ``LiteRTPolicy(payload)`` on the actor (interpreter build + allocate).

``steps`` converts the learner-blocking time (convert, or patch when
available) into learner steps at 0.51 ms/step (shared/PLATFORM_FACTS.md: Adam,
4-256-256-2 MLP, batch 64).

Usage::

    python -m benchmarks.micro.quantize_broadcast              # both nets, ~1-2 min
    python -m benchmarks.micro.quantize_broadcast --nets cartpole --repeats 3 --out qb.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

NETS = {"cartpole": (4, (256, 256), 2), "actorq": (64, (2048,) * 3, 18)}
LEARNER_STEP_S = 0.51e-3


def timed(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def bench_net(name: str, repeats: int) -> list[dict]:
    from core.networks import mlp
    from core.policy import LiteRTPolicy
    from core.quantize import (PATCHABLE_PRECISIONS, PRECISIONS, AsyncQuantizer,
                               FlatbufferPatcher, PolicyQuantizer)

    obs_dim, hidden, out_dim = NETS[name]
    model = mlp(obs_dim, hidden, out_dim, name=name, seed=0)
    rng = np.random.default_rng(0)
    calibration = rng.normal(size=(256, obs_dim)).astype(np.float32)
    weights = model.get_weights()
    rows = []
    for precision in PRECISIONS:
        quantizer = PolicyQuantizer(precision)
        convert_s, payload = timed(lambda: quantizer.quantize(model, 1, calibration), repeats)
        load_s, _ = timed(lambda: LiteRTPolicy(payload, batch_size=1), repeats)
        row = {"net": name, "precision": precision, "bytes": payload.nbytes,
               "convert_s": round(convert_s, 4), "load_ms": round(load_s * 1e3, 2),
               "build_s": None, "patch_ms": None}
        if precision in PATCHABLE_PRECISIONS:
            start = time.perf_counter()
            patcher = FlatbufferPatcher(model, precision)
            row["build_s"] = round(time.perf_counter() - start, 4)
            patch_s, _ = timed(lambda: patcher.patch(weights, 2), max(repeats, 5))
            row["patch_ms"] = round(patch_s * 1e3, 2)
        with AsyncQuantizer(model, precision, patch=False) as aq:
            submit_s, _ = timed(lambda: aq.submit(weights, 3, calibration), max(repeats, 5))
            aq.wait(timeout=120)
        row["submit_ms"] = round(submit_s * 1e3, 3)
        blocking_s = row["patch_ms"] / 1e3 if row["patch_ms"] is not None else convert_s
        row["learner_steps_blocked"] = round(blocking_s / LEARNER_STEP_S, 1)
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'net':9s} {'precision':13s} {'bytes':>10s} {'convert s':>9s} {'build s':>8s} "
          f"{'patch ms':>9s} {'submit ms':>9s} {'load ms':>8s} {'steps':>7s}")
    dash = "-"
    for r in rows:
        build = f"{r['build_s']:.3f}" if r["build_s"] is not None else dash
        patch = f"{r['patch_ms']:.2f}" if r["patch_ms"] is not None else dash
        print(f"{r['net']:9s} {r['precision']:13s} {r['bytes']:10d} {r['convert_s']:9.3f} "
              f"{build:>8s} {patch:>9s} {r['submit_ms']:9.3f} {r['load_ms']:8.2f} "
              f"{r['learner_steps_blocked']:7.1f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="+", choices=sorted(NETS), default=["cartpole", "actorq"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the rows as JSON to this path")
    args = parser.parse_args(argv)
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rows = [row for net in args.nets for row in bench_net(net, args.repeats)]
    print_table(rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
