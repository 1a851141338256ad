"""ActorQ costs measured in this process: env step, policy inference, a policy version, the rollout stage,
shard storage and the learner step, each timed with :func:`timed` (median wall and CPU seconds).

:mod:`benchmarks.studies.actorq_costs` (the tool, its docstring lists every cost) calls these first,
one thread at a time, then :mod:`benchmarks.studies.actorq_costs_workers` on Dask workers.

Example::

    wall, cpu, out = timed(lambda: sum(range(10_000)), repeats=3)
    measure_env(cfg, 200)   # {"wall_s": ..., "cpu_s": ...} per env step
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np



def timed(fn: Callable[[], Any], repeats: int) -> Tuple[float, float, Any]:
    """(median wall s, median CPU s of this process, last result) of ``repeats`` calls."""
    walls, cpus, out = [], [], None
    for _ in range(max(1, repeats)):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), out


def _calibration(env_id: str, n: int, seed: int) -> np.ndarray:
    from core.envs import make_vector_env
    envs, obs = make_vector_env(env_id, 8, seed)
    rows = [obs.reshape(len(obs), -1)]
    while sum(len(r) for r in rows) < n:
        obs, *_ = envs.step(envs.action_space.sample())
        rows.append(obs.reshape(len(obs), -1))
    envs.close()
    return np.concatenate(rows)[:n].astype(np.float32)


def measure_env(cfg, steps: int) -> Dict[str, float]:
    """Vectorized env step alone, per env step (random actions)."""
    from core.envs import make_vector_env
    envs, _ = make_vector_env(cfg.env.id, cfg.env.num_envs, cfg.seed, cfg.env.max_episode_steps)
    actions = [envs.action_space.sample() for _ in range(steps)]
    wall, cpu, _ = timed(lambda: [envs.step(a) for a in actions], 1)
    envs.close()
    n = steps * cfg.env.num_envs
    return {"wall_s": wall / n, "cpu_s": cpu / n}


def measure_inference(payload, obs_dim: int, batches: Sequence[int], calls: int, threads: int) -> Dict[str, Any]:
    """LiteRT policy call time per env step at each batch size."""
    from core.policy import LiteRTPolicy
    out = {}
    for b in batches:
        policy = LiteRTPolicy(payload, batch_size=b, num_threads=threads)
        x = np.random.default_rng(0).normal(size=(b, obs_dim)).astype(np.float32)
        policy(x)  # warm up
        wall, cpu, _ = timed(lambda: [policy(x) for _ in range(calls)], 3)
        out[str(b)] = {"wall_s": wall / (calls * b), "cpu_s": cpu / (calls * b)}
    return out


def measure_version(model, precision: str, calib: np.ndarray, num_envs: int, threads: int,
                    repeats: int) -> Tuple[Dict[str, Any], Any]:
    """Per-version costs: convert, patch, actor load, payload bytes. Returns (costs, payload)."""
    from core.policy import LiteRTPolicy
    from core.quantize import PATCHABLE_PRECISIONS, FlatbufferPatcher, PolicyQuantizer
    quantizer = PolicyQuantizer(precision)
    cw, cc, payload = timed(lambda: quantizer.quantize(model, 1, calib if precision == "int8-full" else None),
                            repeats)
    row: Dict[str, Any] = {"convert_s": cw, "convert_cpu_s": cc, "bytes": payload.nbytes,
                           "patch_s": None, "patch_cpu_s": None, "bcast_s": None}
    if precision in PATCHABLE_PRECISIONS:
        patcher = FlatbufferPatcher(model, precision)
        weights = model.get_weights()
        row["patch_s"], row["patch_cpu_s"], _ = timed(lambda: patcher.patch(weights, 2), max(repeats, 3))
    row["load_s"], row["load_cpu_s"], _ = timed(lambda: LiteRTPolicy(payload, batch_size=num_envs,
                                                                      num_threads=threads), max(repeats, 3))
    return row, payload


def measure_rollouts(cfg, builder, payload, tasks: int, run_id: str) -> Tuple[Dict[str, float], List[Any]]:
    """The rollout stage per env step, and the results (shards for storage and learner)."""
    from core.actor import ActorSpec
    from core.rollout import release_actors, run_rollout_task
    explore = builder.exploration(cfg.agent, 0, 0)
    spec = ActorSpec(run_id, cfg.env.id, cfg.env.num_envs, cfg.seed, 0, cfg.env.max_episode_steps,
                     cfg.threads.litert, builder.action_selector)
    run_rollout_task(spec, payload, 0, 4, explore)   # warm up: envs + interpreter
    results, walls, cpus = [], [], []
    for k in range(1, tasks + 1):
        w0, c0 = time.perf_counter(), time.process_time()
        results.append(run_rollout_task(spec, payload, k, cfg.actors.steps_per_task, explore))
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    release_actors(run_id)
    steps = sum(r.stats.env_steps for r in results)
    infer = sum(r.stats.inference_seconds for r in results)
    return {"wall_s": sum(walls) / steps, "cpu_s": sum(cpus) / steps, "inference_wall_s": infer / steps}, results


def shard_groups(cfg, results: List[Any]) -> List[List[Any]]:
    """Rollout results as the shards :func:`measure_storage` writes: up to one round of actor tasks
    each, fewer when that leaves under 3 shards."""
    per = max(1, min(cfg.actors.num_actors, len(results) // 3))
    return [results[i:i + per] for i in range(0, len(results), per)]


def measure_storage(cfg, store, store_url: str, results: List[Any], shards: int) -> Dict[str, float]:
    """Shard write, commit and the learner's cache refresh, per shard and per env step.

    Shards hold up to one round of actor tasks, fewer when that leaves under 3
    shards: the first shard pays one-off costs (opening the log, the cache's
    first fill), which a run pays once, so the figures are medians over the
    shards after it (the first alone if it is the only one).
    """
    from core.replay import ReplayCache
    from pipelines.run import resume as resume_lib
    from pipelines.run import stages
    groups = shard_groups(cfg, results)[:shards]
    cache = ReplayCache(store, max_transitions=cfg.replay.capacity)
    cost = {k: [] for k in ("write", "write_cpu", "commit", "commit_cpu", "refresh", "rows")}
    for g, group in enumerate(groups):
        sid = stages.shard_id_for(g)
        ww, wc, info = timed(lambda: stages.write_shard_stage(store_url, sid, group, cfg.replay.writer_options()), 1)
        kw, kc, _ = timed(lambda: stages.commit_stage(store, [sid]), 1)
        # The learner stage refreshes its replay cache to the new shard before it trains on it.
        rw, rc, _ = timed(lambda: resume_lib.refresh_cache(cache, store, g), 1)
        for key, v in (("write", ww), ("write_cpu", wc), ("commit", kw + rw), ("commit_cpu", kc + rc),
                       ("refresh", rw), ("rows", info["rows"])):
            cost[key].append(v)
    med = {k: statistics.median(v[1:] or v) for k, v in cost.items()}
    rows = med["rows"]   # a shard's write and commit cost mostly per shard, not per row (small rows)
    return {"write_s": med["write"] / rows, "write_cpu_s": med["write_cpu"] / rows,
            "commit_s": med["commit"] / rows, "commit_cpu_s": med["commit_cpu"] / rows, "rows": sum(cost["rows"]),
            "write_shard_s": med["write"], "commit_shard_s": med["commit"], "refresh_shard_s": med["refresh"],
            "shards": len(groups)}


def learner_sampler(cfg, builder, store):
    """A sampler over every shard committed to ``store``, as the learner stage samples them."""
    from core.replay import ReplayCache
    cache = ReplayCache(store, max_transitions=cfg.replay.capacity)
    cache.refresh()
    return builder.make_sampler(cache, cfg.agent), cache


def measure_learner(cfg, learner, sampler, cache, calls: int) -> Dict[str, float]:
    """``learn_stage`` per learner step, after one warm-up call (tf.function tracing)."""
    from pipelines.run import stages
    rng = np.random.default_rng(cfg.seed)
    n, batch = cfg.learner.steps_per_call, cfg.agent.batch_size
    first, first_cpu, _ = timed(lambda: stages.learn_stage(learner, sampler, n, batch, rng), 1)
    wall, cpu, _ = timed(lambda: stages.learn_stage(learner, sampler, n, batch, rng), calls)
    # A call of a new shape traces tf.function again (once more with reduce_retracing, the
    # shape-generalized trace): one-off costs the run pays at its first short call.
    second = timed(lambda: stages.learn_stage(learner, sampler, n - 1, batch, rng), 1)[0] if n > 1 else wall
    return {"wall_s": wall / n, "cpu_s": cpu / n, "batch_size": batch, "steps_per_call": n,
            "trace_s": max(0.0, first - wall), "trace_cpu_s": max(0.0, first_cpu - cpu),
            "retrace_s": max(0.0, second - wall * (n - 1) / n), "replay_rows": cache.size}
