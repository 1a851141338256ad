"""Replay sampling throughput from the in-memory cache (transitions/s, one thread).

Fills a ``ReplayCache`` with CartPole-size rollouts (obs float32[4]) through a
memory:// store, then times ``sample()`` for

* ``NStepSampler``             uniform n-step transitions (goal: >= 100,000/s at batch 256);
* ``PrioritizedNStepSampler``  sum-tree sampling + ``update_priorities`` each batch;
* ``SequenceSampler``          [B, 80] sequences with burn-in 40 (counted in rows);

plus ``cache.refresh()`` time for a new shard and for no change.

Usage::

    python benchmarks/micro/replay_sample.py          # 100k rows, ~10 s
    python benchmarks/micro/replay_sample.py --full   # 1M rows
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from core.replay import (NStepSampler, PrioritizedNStepSampler, ReplayCache, ReplayStore,  # noqa: E402
                         SequenceSampler)
from benchmarks.micro.replay_write import make_batches  # noqa: E402


def rate(fn, items_per_call: int, min_seconds: float = 2.0) -> float:
    fn()  # warm-up (also computes sampleable rows)
    calls, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < min_seconds:
        fn()
        calls += 1
    return calls * items_per_call / elapsed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="1M rows instead of 100k")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    rows = 1_048_576 if args.full else 131_072
    store = ReplayStore.open_or_create(f"memory://bench-sample/{uuid.uuid4().hex}", env_id="bench")
    batches = make_batches("cartpole", rows)
    infos = store.write_shards("r000000", batches, target_bytes=4 << 20)
    store.commit([i.id for i in infos])
    cache = ReplayCache(store, max_transitions=rows)
    t0 = time.perf_counter()
    cache.refresh()
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cache.refresh()
    noop_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    uniform = NStepSampler(cache, n=args.n, gamma=0.99)
    prio = PrioritizedNStepSampler(cache, n=args.n, gamma=0.99)

    def prioritized():
        b = prio.sample(args.batch, rng)
        prio.update_priorities(b["index"], rng.random(args.batch))
    seq = SequenceSampler(cache, length=80, burn_in=40)
    results = [
        ("NStepSampler (uniform)", f"B={args.batch}, n={args.n}",
         rate(lambda: uniform.sample(args.batch, rng), args.batch, args.seconds)),
        ("PrioritizedNStepSampler", f"B={args.batch}, n={args.n}, +update",
         rate(prioritized, args.batch, args.seconds)),
        ("SequenceSampler", "B=32, L=80 (rows/s)", rate(lambda: seq.sample(32, rng), 32 * 80, args.seconds)),
    ]
    print(f"cache: {cache.size} rows in {len(infos)} shards; refresh: {load_s * 1e3:.0f} ms to load,"
          f" {noop_s * 1e3:.2f} ms when nothing is new")
    print(f"{'sampler':<26}{'setting':<28}{'per second':>14}")
    for name, setting, r in results:
        print(f"{name:<26}{setting:<28}{r:>14,.0f}")


if __name__ == "__main__":
    main()
