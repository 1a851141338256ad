"""Collect a dataset with a trained policy: ``python -m pipelines.collect RUN_DIR --episodes N --out STORE``.

Loads the run's best evaluated parameters (or ``--checkpoint latest|STEP``),
quantizes them at ``--precision`` (actors run real int8 by default), fans
out rollout tasks on ``--executor local|dask`` and writes complete episodes
(``core.dataset.collect``) as replay shards, made visible by one commit at
the end, so the store goes from empty to complete atomically.

Examples::

    python -m pipelines.collect runs/cartpole-dqn --episodes 100 --out data/cartpole-expert
    python -m pipelines.collect runs/cartpole-dqn --episodes 500 --out data/cp --epsilon 0.1 --executor dask
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Dict, List, Optional

from core.fast_exit import exit_now
from pipelines.cli import check_creatable_dir, check_locations, cli_errors, print_table
from pipelines.evaluate import policy_payload


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.collect", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by pipelines.train")
    p.add_argument("--episodes", type=int, required=True, metavar="N", help="complete episodes to collect (at least)")
    p.add_argument("--out", required=True, metavar="STORE", help="new replay store (local path or URL)")
    p.add_argument("--precision", choices=["fp32", "int8-dynamic", "int8-full"], default="int8-dynamic",
                   help="actor precision (default int8-dynamic)")
    p.add_argument("--executor", choices=["local", "dask"], default="local")
    p.add_argument("--checkpoint", default="best", metavar="STEP|latest|best", help="which parameters (default best)")
    p.add_argument("--epsilon", type=float, default=0.0, help="epsilon-greedy exploration of the actors (default 0)")
    p.add_argument("--num-actors", type=int, default=2)
    p.add_argument("--num-envs", type=int, default=8, help="envs per actor")
    p.add_argument("--steps-per-task", type=int, default=64)
    p.add_argument("--seed", type=int, default=424_242)
    return p


def check_options(episodes: int, epsilon: float, num_actors: int, num_envs: int, steps_per_task: int,
                  seed: int) -> None:
    """One-line DatasetError for the first option out of range (0 actors would collect 0 episodes)."""
    from core.config import MAX_SEED
    from core.dataset.errors import DatasetError
    checks = [("--episodes", episodes, episodes >= 1, ">= 1"),
              ("--epsilon", epsilon, 0.0 <= epsilon <= 1.0, "0..1"),
              ("--num-actors", num_actors, num_actors >= 1, ">= 1"),
              ("--num-envs", num_envs, 1 <= num_envs <= 4096, "1..4096"),
              ("--steps-per-task", steps_per_task, steps_per_task >= 1, ">= 1"),
              ("--seed", seed, 0 <= seed <= MAX_SEED, f"0..{MAX_SEED}")]
    for flag, value, ok, valid in checks:
        if not ok:
            raise DatasetError(f"{flag} {value} is out of range; valid: {valid}")


def collect(run_dir: str, episodes: int, out: str, precision: str = "int8-dynamic", executor: str = "local",
            checkpoint: str = "best", epsilon: float = 0.0, num_actors: int = 2, num_envs: int = 8,
            steps_per_task: int = 64, seed: int = 424_242, progress: bool = True) -> Dict[str, Any]:
    """Collect at least ``episodes`` complete episodes into the new store ``out``; returns a summary."""
    from core import urls
    from core.dataset.collect import collect_rollout_task, needs_more
    from core.dataset.errors import DatasetError
    from core.replay import ReplayStore
    from core.actor import ActorSpec
    from pipelines.run import stages
    from pipelines.executors.factory import make_executor
    check_options(episodes, epsilon, num_actors, num_envs, steps_per_task, seed)
    out = urls.normalize(out)
    fs, path = urls.resolve(out)
    if fs.exists(path) and not fs.isdir(path):
        raise DatasetError(f"--out {out} is a file; valid: a new, absent or empty folder")
    if fs.exists(path) and fs.ls(path, detail=False):
        raise DatasetError(f"--out {out} already exists and is not empty; valid: a new, absent or empty folder")
    if urls.scheme_of(out) == "file":   # unwritable: fail now, not after loading and quantizing the policy
        check_creatable_dir(out, "--out")
    cfg, builder, payload, label = policy_payload(run_dir, checkpoint, precision, seed, version=1)
    store = ReplayStore.open_or_create(out, env_id=cfg.env.id, **cfg.replay.writer_options())
    ex = make_executor(executor, cfg)
    start = time.time()
    try:
        ref = ex.broadcast(payload)
        run_id = f"collect-{abs(hash(out)) % 10**8}"
        specs = [ActorSpec(run_id, cfg.env.id, num_envs, seed, a, cfg.env.max_episode_steps, 1,
                           builder.action_selector) for a in range(num_actors)]
        explore = {"epsilon": float(epsilon)}
        next_task, admit_before, ended, rows = [0] * num_actors, None, 0, 0
        in_flight: Dict[Any, int] = {}
        pending: List[Any] = []
        writes: List[Any] = []

        def submit(a: int) -> None:
            k = next_task[a]
            next_task[a] += 1
            fut = ex.submit(collect_rollout_task, specs[a], ref, k, steps_per_task, explore, admit_before,
                            key=f"{run_id}-a{a}-t{k}", actor=a)
            in_flight[fut] = a

        def flush() -> None:
            writes.append(ex.submit(stages.write_shard_stage, store.url, stages.shard_id_for(len(writes)),
                                    list(pending), cfg.replay.writer_options(), key=f"{run_id}-write-{len(writes)}"))
            pending.clear()
        for a in range(num_actors):
            submit(a)
        while in_flight:
            for fut in ex.wait(list(in_flight), timeout=0.1):
                a = in_flight.pop(fut)
                r = fut.result()
                ended += r.episodes_ended
                rows += r.kept_rows
                if r.kept_rows:
                    pending.append(fut)
                if admit_before is None and ended >= episodes:
                    admit_before = max(next_task)  # episodes started from here on are not admitted
                if needs_more(r.open_start_tasks, admit_before):
                    submit(a)
                if len(pending) >= 4 * num_actors:
                    flush()
            if progress:
                print(f"\rcollect: {ended}/{episodes} episodes, {rows:,} steps, "
                      f"{rows / max(time.time() - start, 1e-9):,.0f} steps/s", end="", file=sys.stderr)
        if pending:
            flush()
        ids = [w.result()["shard_id"] for w in writes]
        version = stages.commit_stage(store, ids, meta={"op": "collect", "source": run_dir, "parameters": label,
                                                         "precision": precision, "epsilon": float(epsilon)})
    except BaseException:
        if fs.exists(path):
            fs.rm(path, recursive=True)
        raise
    finally:
        ex.close()
        if progress:
            print(file=sys.stderr)
    return {"out": store.url, "env_id": cfg.env.id, "parameters": label, "precision": precision,
            "episodes": ended, "steps": rows, "shards": len(ids), "version": version,
            "wall_s": time.time() - start, "payload_bytes": payload.nbytes}


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    a = build_parser().parse_args(argv)
    check_locations(("RUN_DIR", a.run_dir), ("--out", a.out))
    summary = collect(a.run_dir, a.episodes, a.out, a.precision, a.executor, a.checkpoint, a.epsilon,
                      a.num_actors, a.num_envs, a.steps_per_task, a.seed)
    print_table(["", ""], [[k, f"{v:.1f}" if isinstance(v, float) else v] for k, v in summary.items()])
    return 0


if __name__ == "__main__":  # Dask spawns workers that re-import __main__: keep this guard.
    exit_now(main())
