"""Opening a replay store's commit log: from the latest log checkpoint vs folding every entry.

Builds a log of ``--versions`` add entries (one shard each, as a run's commit
stage makes them) and times reading its latest state with a fresh
``CommitLog``, both ways, interleaved; prints the median of ``--repeats``.

Usage::

    python benchmarks/micro/log_open.py                  # 2,000 versions, local disk
    python benchmarks/micro/log_open.py --versions 10000
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from core.replay.commit_log import CHECKPOINT_EVERY, CommitLog  # noqa: E402
from core.replay.schema import ShardInfo  # noqa: E402


def build(url: str, versions: int) -> None:
    log = CommitLog(url)
    for v in range(versions):
        info = ShardInfo(id=f"s{v:08d}", rows=1024, nbytes=40_000, token=f"{v:032x}", created=time.time(),
                         policy_version_min=v, policy_version_max=v, num_segments=9)
        log.append(lambda state, info=info: {"op": "add", "shards": [info.to_json()]})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=2000, help="log entries to create")
    parser.add_argument("--repeats", type=int, default=5, help="timed opens per way (median reported)")
    parser.add_argument("--dir", default=None, help="where to build the log (default: a temp dir)")
    args = parser.parse_args(argv)
    url = tempfile.mkdtemp(dir=args.dir, prefix="log-open-")
    t0 = time.perf_counter()
    build(url, args.versions)
    print(f"built {args.versions} versions in {time.perf_counter() - t0:.1f} s (checkpoint every {CHECKPOINT_EVERY})")
    times = {"from checkpoint": [], "every entry": []}
    for _ in range(args.repeats):
        for label, use in (("from checkpoint", True), ("every entry", False)):
            t0 = time.perf_counter()
            state = CommitLog(url, use_checkpoints=use).state()
            times[label].append(time.perf_counter() - t0)
            assert state.version == args.versions and len(state.live) == args.versions
    med = {k: statistics.median(v) for k, v in times.items()}
    for label, t in med.items():
        print(f"{label:>16}: {t * 1e3:8.1f} ms")
    print(f"{'speed-up':>16}: {med['every entry'] / med['from checkpoint']:8.1f}x")


if __name__ == "__main__":
    main()
