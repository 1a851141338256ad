"""Replay shard write throughput vs np.save (+fsync) and vs raw tensorstore, side by side.

Writes the same arrays (every field of a shard: observation, action, reward,
..., extras) five ways and reports MB/s of raw (uncompressed) data, median of
``--repeats`` runs after one untimed warm-up round:

* ``np.save+fsync``  one .npy per array, fsynced (no compression, no chunks);
* ``tensorstore``    tensorstore zarr3, same chunks and codecs (bytes/zstd/crc32c),
                     all array writes in flight at once, default ``write`` (the
                     goal's reference);
* ``ts no-copy``     the same with ``can_reference_source_data_indefinitely=True``
                     (tensorstore encodes straight from the caller's arrays);
* ``ReplayStore``    ``store.write_shard`` (default engine: tensorstore), starting
                     from the rollout batches: gathering their rows, the episode
                     index and the metadata are all timed. One store writes
                     successive shards, as in a run, so its reused buffers are warm;
* ``ReplayStore/zarr`` the same with the zarr-python engine (used for fsspec URLs).

The batches are laid out as ``core.rollout`` makes them (env-major storage).

Usage::

    python benchmarks/micro/replay_write.py            # small (< 1 min)
    python benchmarks/micro/replay_write.py --full     # 20k Atari frames, 1M CartPole steps
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from core.replay import ReplayStore  # noqa: E402
from core.replay.shard_writer import concat_rows, episode_segments  # noqa: E402
from core.replay.write_engines import _TensorstoreEngine  # noqa: E402
from core.trajectory import TrajectoryBatch, make_episode_id, step_buffer  # noqa: E402


def make_batches(kind: str, rows: int, envs: int = 8, steps: int = 128, seed: int = 0):
    """Rollout batches [steps, envs, ...], stored env-major as ``core.rollout`` stores them
    (``trajectory.step_buffer``); Atari frames are compressible, game-like images."""
    rng = np.random.default_rng(seed)
    n_batches = max(1, rows // (envs * steps))
    if kind == "atari":
        base = (rng.integers(0, 4, (84, 168)) * 40).astype(np.uint8)
        base = np.repeat(np.repeat(base[::4, ::4], 4, 0), 4, 1)[:84, :168]

    def rollout_layout(value):
        buf = step_buffer(steps, envs, value.shape[2:], value.dtype)
        buf[...] = value
        return buf

    out = []
    for b in range(n_batches):
        t = np.arange(steps)[:, None] + b * steps
        if kind == "atari":
            shift = (t + np.arange(envs)[None, :] * 7) % 84
            obs = np.stack([np.stack([base[:, s:s + 84] for s in row]) for row in shift])
            obs[:, :, 40:44, 20:24] = 255
        else:
            obs = rng.standard_normal((steps, envs, 4)).astype(np.float32)
        term = rng.random((steps, envs)) < 0.01
        fields = dict(
            observation=obs, action=rng.integers(0, 6, (steps, envs)).astype(np.int64),
            reward=rng.random((steps, envs)).astype(np.float32), discount=(~term).astype(np.float32),
            terminated=term, truncated=np.zeros_like(term),
            episode_id=make_episode_id(np.arange(envs)[None, :] + b * envs, 0).repeat(steps, 0),
            step=np.broadcast_to(np.arange(steps, dtype=np.int32)[:, None], (steps, envs)),
            policy_version=np.full((steps, envs), b, np.int64))
        out.append(TrajectoryBatch(**{k: rollout_layout(v) for k, v in fields.items()}, env_id="bench"))
    return out


def bench_npsave(arrays, root):
    os.makedirs(root)
    for i, a in enumerate(arrays.values()):
        with open(os.path.join(root, f"{i}.npy"), "wb") as f:
            np.save(f, a)
            f.flush()
            os.fsync(f.fileno())


def timed_interleaved(methods, repeats):
    """Median seconds per method; methods run round-robin so that load on a shared machine
    affects all of them alike. ``methods``: {label: (fn(r), cleanup(r))}, cleanup not timed.
    Round -1 is an untimed warm-up."""
    times = {label: [] for label in methods}
    for r in range(-1, repeats):
        for label, (fn, cleanup) in methods.items():
            t0 = time.perf_counter()
            fn(r)
            if r >= 0:
                times[label].append(time.perf_counter() - t0)
            cleanup(r)
    return {label: statistics.median(t) for label, t in times.items()}


def run(kind: str, rows: int, repeats: int, threads: int, chunk_bytes: int, tmp: str):
    batches = make_batches(kind, rows)
    arrays = concat_rows(batches)
    arrays.update({f"episodes/{k}": v for k, v in episode_segments(arrays).items()})
    nbytes = sum(a.nbytes for a in concat_rows(batches).values())
    engine = _TensorstoreEngine(threads)

    def scratch(label):
        return lambda r: os.path.join(tmp, f"{label}-{r}")

    def in_scratch(label, fn):
        path = scratch(label)
        return lambda r: fn(path(r)), lambda r: shutil.rmtree(path(r), ignore_errors=True)

    def into_store(eng):
        store = ReplayStore.open_or_create(os.path.join(tmp, f"store-{eng}"), env_id="bench", engine=eng,
                                           threads=threads, chunk_bytes=chunk_bytes)
        return (lambda r: store.write_shard(f"s{r + 1:08d}", batches),
                lambda r: store.writer.remove(f"s{r + 1:08d}"))   # uncommitted: never visible

    return nbytes, timed_interleaved({
        "np.save+fsync": in_scratch("npy", lambda root: bench_npsave(arrays, root)),
        "tensorstore": in_scratch("ts", lambda root: engine.write_all(root, arrays, chunk_bytes, 3)),
        "ts no-copy": in_scratch("ts-ref", lambda root: engine.write_all(root, arrays, chunk_bytes, 3,
                                                                           referenced=True)),
        "ReplayStore": into_store("tensorstore"),
        "ReplayStore/zarr": into_store("zarr"),
    }, repeats)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="large sizes (20k frames, 1M CartPole steps)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per method (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="encoder threads of every tensorstore writer")
    parser.add_argument("--chunk-bytes", type=int, default=4 << 20, help="raw bytes per chunk, all methods")
    parser.add_argument("--dir", default=None, help="scratch folder (default: a temp dir)")
    args = parser.parse_args(argv)
    sizes = {"atari": 20_480 if args.full else 4_096, "cartpole": 1_048_576 if args.full else 131_072}
    tmp = tempfile.mkdtemp(dir=args.dir, prefix="replay-write-")
    print(f"{'data':<10}{'rows':>9}{'MB':>8}  " + "".join(f"{m:>18}" for m in
          ("np.save+fsync", "tensorstore", "ts no-copy", "ReplayStore", "ReplayStore/zarr"))
          + f"{'RS/ts':>8}{'RS/ts-nc':>10}{'RS/npy':>8}")
    try:
        for kind, rows in sizes.items():
            nbytes, res = run(kind, rows, args.repeats, args.threads, args.chunk_bytes, tmp)
            mbs = {k: nbytes / t / 1e6 for k, t in res.items()}
            print(f"{kind:<10}{rows:>9}{nbytes / 1e6:>8.1f}  " + "".join(f"{mbs[m]:>13.0f} MB/s" for m in mbs)
                  + f"{mbs['ReplayStore'] / mbs['tensorstore']:>8.2f}{mbs['ReplayStore'] / mbs['ts no-copy']:>10.2f}"
                  + f"{mbs['ReplayStore'] / mbs['np.save+fsync']:>8.2f}",
                  flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
