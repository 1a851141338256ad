"""ActorQ's run as costs: what an env step, a learner step and a policy version cost per precision,
and the whole-run env steps/s they predict (a small Amdahl / bottleneck model).

Usage::

    python -m benchmarks.actorq_costs                                     # configs/actorq/cartpole-dqn.yaml
    python -m benchmarks.actorq_costs --config configs/actorq/pendulum-d4pg.yaml --quick
    python -m benchmarks.actorq_costs --out benchmarks/results/actorq_costs-cartpole.json
    python -m benchmarks.actorq_costs --predict benchmarks/results/actorq_costs-cartpole.json \\
        --set learner.replay_ratio=0.01 --set actors.num_actors=8 --cores 16   # model only, no measuring

Measured, per precision, with the config's real stages and networks (median
over ``--repeats``; wall seconds and CPU seconds of this process, so TF's
intra-op threads count):

* ``inference``: ``LiteRTPolicy`` on the actor network, per env step, at
  batch 1 and at the actors' batch (``env.num_envs``), and as the rollout
  stage sees it (``RolloutStats.inference_seconds``);
* ``env``: the vectorized env step alone (random actions), per env step;
* ``rollout``: ``run_rollout_task`` per env step (env + inference + action
  selection + trajectory assembly), the actor task as it runs on a worker;
* ``learner``: ``learn_stage`` per learner step (``agent.batch_size``,
  ``learner.steps_per_call`` steps per call, the config's network, replay
  sampled from shards the rollouts wrote), and ``trace_s``: the first call's
  extra seconds (``tf.function`` tracing);
* ``version``: ``PolicyQuantizer.quantize`` (convert), ``FlatbufferPatcher.patch``
  (where the precision allows), actor-side ``LiteRTPolicy`` load, payload
  bytes, and a Dask ``scatter(broadcast=True)`` to the run's actor workers (``--no-dask`` skips it);
* ``rollout_parallel``: the rollout stage on those Dask workers, every actor's
  tasks chained on its worker and all actors at once, as in the run (not with ``--no-dask``);
* ``corun``: the same parallel rollouts again while this process trains the
  learner beside them, one step per call, as the run's driver does in the
  middle of a run: the learner's seconds per step and the actors' seconds per
  env step when both run at once (CPU sharing, and the memory bandwidth and
  caches a 3x2048 policy's weights contend for, which CPU seconds do not show),
  and fetching a shard write's (small) result from a worker busy with rollouts;
* ``storage``: ``write_shard_stage`` and ``commit_stage`` per env step and per shard, shards
  of one round of tasks (``actors.num_actors`` x ``env.num_envs`` x
  ``actors.steps_per_task`` rows); "commit" includes the learner's replay cache
  refresh that follows each commit in the run (``refresh_shard_s`` on its own);
  ``dispatch_s`` (on the Dask workers): a block's task graph with no work in it,
  submit to result (:func:`block_round_trip`), ``dispatch_submit_s`` of it the
  submit calls of that empty graph and ``driver_gather_s`` fetching the write's
  result, and ``driver_submit_s``: the driver thread's submit calls for a
  block's real tasks (``run_rollout_task`` submits timed in ``rollout_parallel``);
  ``first_write_shard_s`` (on the Dask workers): a fresh worker's first shard
  write, which pays the write engine's imports (:func:`first_shard_writes`).

The model (``benchmarks.actorq_model``, its docstring has the formulas):
steady-state bounds (actors, learner, CPU) and the finite run played out as
the driver's block pipeline. ``benchmarks.actorq_validate`` compares it with
whole runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from benchmarks.actorq_model import predict, setting  # noqa: F401  (the CLI's model)

DEFAULT_CONFIG = os.path.join("configs", "actorq", "cartpole-dqn.yaml")
PRECISIONS = ("fp32", "int8-dynamic", "int8-full")
SCHEMA = "databloom.actorq_costs/1"


# ------------------------------------------------------------------ measuring

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
    from core.rollout import ActorSpec, release_actors, run_rollout_task
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


def measure_rollouts_parallel(cfg, builder, payload, client, tasks: int, run_id: str,
                              learn: Optional[Callable[[], None]] = None) -> Dict[str, float]:
    """The rollout stage as the run runs it: every actor's tasks chained on its Dask worker, all at once.

    Per env step from the tasks' own ``RolloutStats.seconds`` (what the run's
    ``workers`` records count), after one warm-up task per actor. With
    ``learn`` (one learner step), this process trains while the rollouts run
    and ``learner_wall_s`` is the median wall of the steps that began after
    the warm-up tasks and ended before the last rollout did (None if none did);
    after each step it fetches a small value held by a busy worker, as the
    driver fetches a shard write's result, and ``gather_wall_s`` is their median.
    """
    from core.rollout import ActorSpec, release_actors, run_rollout_task
    workers = _workers(client)
    ref = client.scatter(payload, broadcast=True, hash=False)
    explore = builder.exploration(cfg.agent, 0, 0)
    futures = []
    t_submit = time.perf_counter()
    for a in range(cfg.actors.num_actors):
        spec = ActorSpec(run_id, cfg.env.id, cfg.env.num_envs, cfg.seed, a, cfg.env.max_episode_steps,
                         cfg.threads.litert, builder.action_selector)
        prev = None
        for k in range(tasks + 1):
            prev = client.submit(run_rollout_task, spec, ref, k, cfg.actors.steps_per_task, explore, after=prev,
                                 key=f"{run_id}-a{a}-t{k}", workers=[workers[a % len(workers)]])
            futures.append((k, prev))
    submit_s = (time.perf_counter() - t_submit) / len(futures)     # the driver's cost per task submitted
    learner_walls: List[float] = []
    gathers: List[float] = []
    if learn is not None:
        # What write_shard_stage returns, held on each worker (fetched while the worker steps envs).
        probes = [client.scatter([{"shard_id": "s00000000", "rows": 512, "nbytes": 1 << 20, "tasks": []}],
                                 workers=[w], hash=False)[0] for w in workers]
    warm = [fut for k, fut in futures if k == 0]
    while not all(fut.done() for fut in warm):
        time.sleep(0.001)
    t_chains = time.perf_counter()
    if learn is not None:
        running = lambda: not all(fut.done() for _, fut in futures)  # noqa: E731
        while running():
            t0 = time.perf_counter()
            learn()
            if running():                                  # the whole step ran beside the actors
                learner_walls.append(time.perf_counter() - t0)
                t1 = time.perf_counter()
                probes[len(gathers) % len(probes)].result()
                if running():
                    gathers.append(time.perf_counter() - t1)
    from distributed import wait
    wait([fut for _, fut in futures])
    chains_s = time.perf_counter() - t_chains
    stats = [fut.result().stats for k, fut in futures if k > 0]
    client.run(release_actors, run_id)
    steps = sum(st.env_steps for st in stats)
    out = {"wall_s": sum(st.seconds for st in stats) / steps,
           # per env step and worker as the chains ran: the gaps between chained tasks (dispatch) included
           "chain_wall_s": chains_s * len(workers) / steps,
           "inference_wall_s": sum(st.inference_seconds for st in stats) / steps, "workers": len(workers),
           "submit_s": submit_s}
    if learn is not None:
        out.update(learner_wall_s=statistics.median(learner_walls) if learner_walls else None,
                   learner_steps=len(learner_walls),
                   gather_wall_s=statistics.median(gathers) if gathers else None)
    return out


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


def measure(cfg, precisions: Sequence[str], repeats: int, tasks: int, learner_calls: int,
            dask: bool) -> Dict[str, Any]:
    """Every cost the model needs, for config ``cfg``."""
    from core.agents.registry import get_builder
    from core.envs import env_spec
    from core.replay import ReplayStore
    from pipelines.run.driver import configure_threads
    configure_threads(cfg)
    import tensorflow as tf
    tf.config.experimental.enable_op_determinism()   # as the run's learner (pipelines.run.driver): +~3 s first trace
    spec = env_spec(cfg.env.id)
    builder = get_builder(cfg.agent.algo)
    learner = builder.make_learner(spec, cfg.agent, cfg.seed)
    model = learner.policy_model
    calib = _calibration(cfg.env.id, cfg.actors.calibration_size, cfg.seed)
    out: Dict[str, Any] = {"env": measure_env(cfg, 200), "precisions": {}}
    rollout_results: List[Any] = []
    payloads = {}
    # In-process costs first, one thread at a time (their wall / CPU gives the machine's load,
    # benchmarks.actorq_model.contention); the Dask workers start only afterwards.
    for p in precisions:
        version, payloads[p] = measure_version(model, p, calib, cfg.env.num_envs, cfg.threads.litert, repeats)
        inference = measure_inference(payloads[p], spec.obs_dim, sorted({1, cfg.env.num_envs}), 50,
                                      cfg.threads.litert)
        rollout, results = measure_rollouts(cfg, builder, payloads[p], tasks, f"costs-{p}")
        rollout_results += results
        out["precisions"][p] = {"version": version, "inference": inference, "rollout": rollout}
    with tempfile.TemporaryDirectory(prefix="actorq-costs-") as tmp:
        store_url = os.path.join(tmp, "replay")
        store = ReplayStore.open_or_create(store_url, env_id=cfg.env.id, **cfg.replay.writer_options())
        out["storage"] = measure_storage(cfg, store, store_url, rollout_results, len(rollout_results))
        sampler, cache = learner_sampler(cfg, builder, store)
        out["learner"] = measure_learner(cfg, learner, sampler, cache, learner_calls)
        if dask:
            from pipelines.run import stages
            rng = np.random.default_rng(cfg.seed + 1)
            learn = lambda: stages.learn_stage(learner, sampler, 1, cfg.agent.batch_size, rng)  # noqa: E731
            learn()   # a one-step call's shape (reduce_retracing generalized it already: no new trace)
            measure_on_workers(cfg, builder, payloads, out, repeats, tasks, learn, store_url,
                               shard_groups(cfg, rollout_results)[0])
    return out


def block_round_trip(client, actors: int, repeats: int = 20) -> Dict[str, float]:
    """A block's task graph with no work in it: one task per actor on its worker and one task taking
    all their results (the shard write). One task per actor: the gaps between an actor's chained tasks
    are in ``rollout_parallel``'s ``chain_wall_s``. Medians over ``repeats`` of:

    * ``dispatch_s``: first submit to the write's result held at the driver;
    * ``submit_s``: the driver's own submit calls (its thread, so serial with its learner);
    * ``gather_s``: fetching the finished write's result (the driver's thread, likewise).
    """
    import uuid
    from distributed import wait
    workers = _workers(client)
    walls: Dict[str, List[float]] = {"dispatch_s": [], "submit_s": [], "gather_s": []}
    for r in range(repeats):
        tag = uuid.uuid4().hex[:8]
        t0 = time.perf_counter()
        parts = [client.submit(abs, -a, key=f"rt-{tag}-{a}", workers=[workers[a % len(workers)]], pure=False)
                 for a in range(actors)]
        write = client.submit(len, parts, key=f"rt-{tag}-w", pure=False)
        t1 = time.perf_counter()
        wait([write])
        t2 = time.perf_counter()
        write.result()
        t3 = time.perf_counter()
        walls["dispatch_s"].append(t3 - t0)
        walls["submit_s"].append(t1 - t0)
        walls["gather_s"].append(t3 - t2)
    return {k: statistics.median(v) for k, v in walls.items()}


def _workers(client) -> List[str]:
    """The cluster's worker addresses, all of them (``scheduler_info()`` lists at most 5), waiting up
    to 30 s for one: a run of this tool once read an empty worker list between two measurements."""
    client.wait_for_workers(1, timeout=30)
    return sorted(client.scheduler_info(n_workers=-1)["workers"])


def first_shard_writes(client, store_url: str, group: List[Any], writer_options: Dict[str, Any]) -> float:
    """Median over fresh workers of their first ``write_shard_stage`` (s, as the stage times itself).

    A worker's first write imports the write engine (tensorstore, zarr): 1.19-1.27 s in an actor-bound
    CartPole run against ~0.03 s for every later write (benchmarks/RESULTS.md), a one-off cost that the
    in-process ``measure_storage``, whose process has imported them, never sees. Run before any other
    task on the workers; the shards stay uncommitted (invisible) in the tool's scratch store.
    """
    from pipelines.run import stages
    workers = _workers(client)
    futures = [client.submit(stages.write_shard_stage, store_url, stages.shard_id_for(900_000 + i), group,
                             writer_options, key=f"first-write-{i}", workers=[w], pure=False)
               for i, w in enumerate(workers)]
    return statistics.median(f.result()["write_s"] for f in futures)


def measure_on_workers(cfg, builder, payloads: Dict[str, Any], out: Dict[str, Any], repeats: int,
                       tasks: int, learn: Callable[[], None], store_url: str, group: List[Any]) -> None:
    """Fresh workers' first shard write, then Dask scatter, parallel rollouts and co-run (rollouts beside
    ``learn``) per precision, on a LocalCluster of the run's actor workers."""
    from distributed import Client, LocalCluster
    n = min(cfg.actors.num_actors, cfg.dask.n_workers or os.cpu_count() or 1)
    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    try:
        out["storage"]["first_write_shard_s"] = first_shard_writes(client, store_url, group,
                                                                   cfg.replay.writer_options())
        from pipelines.run.plan import TrainingPlan
        tasks_per_block = cfg.actors.num_actors * TrainingPlan.from_config(cfg).tasks_per_block
        trip = block_round_trip(client, cfg.actors.num_actors)
        out["storage"].update(dispatch_s=trip["dispatch_s"], dispatch_submit_s=trip["submit_s"],
                              driver_gather_s=trip["gather_s"])
        for p, payload in payloads.items():
            def scatter():
                fut = client.scatter(payload, broadcast=True, hash=False)
                client.cancel(fut)
            v = out["precisions"][p]["version"]
            v["bcast_s"], v["bcast_cpu_s"], _ = timed(scatter, max(repeats, 3))
            # Enough tasks for ~2-3 s of rollouts: short chains vary by tens of percent between
            # measurements, and many learner steps must fit inside the co-run.
            per_task = lambda r: r["wall_s"] * cfg.actors.steps_per_task * cfg.env.num_envs  # noqa: E731
            par_tasks = min(500, max(tasks, int(2.0 / max(per_task(out["precisions"][p]["rollout"]), 1e-6))))
            out["precisions"][p]["rollout_parallel"] = measure_rollouts_parallel(
                cfg, builder, payload, client, par_tasks, f"costs-par-{p}")
            # The driver submits a block's rollout tasks (the real call, measured above) and its write.
            if p == next(iter(payloads)):
                out["storage"]["driver_submit_s"] = (
                    out["precisions"][p]["rollout_parallel"]["submit_s"] * (tasks_per_block + 1))
            task_s = per_task(out["precisions"][p]["rollout_parallel"])
            co_tasks = min(500, max(2 * tasks, int(3.0 / max(task_s, 1e-6))))
            co = measure_rollouts_parallel(cfg, builder, payload, client, co_tasks, f"costs-co-{p}", learn)
            out["precisions"][p]["corun"] = {"rollout_wall_s": co["wall_s"], "chain_wall_s": co["chain_wall_s"],
                                             "learner_wall_s": co["learner_wall_s"],
                                             "learner_steps": co["learner_steps"],
                                             "gather_wall_s": co["gather_wall_s"]}
    finally:
        client.close()
        cluster.close()


# ----------------------------------------------------------------------- CLI

def _table(costs: Dict[str, Any], pred: Dict[str, Any], s: Dict[str, Any]) -> None:
    from pipelines.cli import print_table
    lrn, sto, env = costs["learner"], costs["storage"], costs["env"]
    print(f"\nenv step alone {env['wall_s'] * 1e6:.1f} us/step; learner {lrn['wall_s'] * 1e3:.1f} ms/step "
          f"(CPU {lrn['cpu_s'] * 1e3:.1f} ms; batch {lrn['batch_size']}, {lrn['steps_per_call']}/call); "
          f"shard write {sto['write_s'] * 1e6:.1f} us/step, commit {sto['commit_s'] * 1e6:.1f} us/step")
    rows = []
    for p, c in costs["precisions"].items():
        v, inf = c["version"], c["inference"]
        rows.append([p, *(f"{inf[b]['wall_s'] * 1e6:.1f}" for b in sorted(inf, key=int)),
                     f"{c['rollout']['inference_wall_s'] * 1e6:.1f}", f"{c['rollout']['wall_s'] * 1e6:.1f}",
                     f"{v['convert_s']:.3f}", "-" if v["patch_s"] is None else f"{v['patch_s'] * 1e3:.1f}",
                     f"{v['load_s'] * 1e3:.1f}", "-" if v["bcast_s"] is None else f"{v['bcast_s'] * 1e3:.1f}",
                     v["bytes"]])
    batches = sorted(next(iter(costs["precisions"].values()))["inference"], key=int)
    print_table(["precision", *(f"infer b={b} us/step" for b in batches), "infer in rollout us/step",
                 "rollout us/step", "convert s", "patch ms", "load ms", "scatter ms", "bytes"], rows)
    print(f"\nmodel: replay_ratio {s['replay_ratio']}, {s['num_actors']} actors x {s['num_envs']} envs on "
          f"{min(s['num_actors'], s['workers'])} workers, {s['cores']} cores, broadcast every "
          f"{s['broadcast_period']} learner steps")
    print_table(["precision", "env steps/s", "bound", "actors", "learner", "cpu", "vs fp32",
                 f"time for {s['budget_env_steps']} steps s"],
                [[p, f"{x['env_steps_per_s']:.0f}", x["bound"], *(f"{x['bounds'][k]:.0f}" for k in
                  ("actors", "learner", "cpu")), "-" if x["speedup_vs_fp32"] is None else f"{x['speedup_vs_fp32']:.2f}x", f"{x['time_s']:.0f}"]
                 for p, x in pred.items()])


def main(argv: Optional[Sequence[str]] = None) -> int:
    from core.config import load_config
    from pipelines.cli import cli_errors
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=4, help="rollout tasks per precision")
    ap.add_argument("--learner-calls", type=int, default=2)
    ap.add_argument("--cores", type=int, default=None, help="cores for the model (default: this machine's)")
    ap.add_argument("--env-steps", type=int, default=None, help="env steps to target (default: the budget)")
    ap.add_argument("--no-dask", action="store_true", help="skip the Dask scatter measurement")
    ap.add_argument("--quick", action="store_true", help="1 repeat, 2 tasks, 1 learner call")
    ap.add_argument("--predict", metavar="COSTS_JSON", help="model only, from a stored --out file")
    ap.add_argument("--out", help="write costs, setting and prediction as JSON")
    args = ap.parse_args(argv)
    return cli_errors(_run)(args, load_config)


def _load_costs(path: str) -> Dict[str, Any]:
    from core.config import ConfigError
    with open(path) as f:
        try:
            record = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--predict {path!r} is not JSON ({e.msg} at line {e.lineno}); valid: a file "
                              f"written by --out") from None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise ConfigError(f"--predict {path!r} is not an actorq_costs record; valid: a file with schema {SCHEMA}")
    return record["costs"]


def _run(args, load_config) -> int:
    from core.config import ConfigError
    cfg = load_config(args.config, args.set)
    if args.predict:
        costs = _load_costs(args.predict)
    else:
        if args.quick:
            args.repeats, args.tasks, args.learner_calls = 1, 2, 1
        bad = [p for p in args.precisions if p not in ("fp32", "fp16", "int8-dynamic", "int8-full")]
        if bad:
            raise ConfigError(f"unknown precision {bad[0]!r}; valid: fp32, fp16, int8-dynamic, int8-full")
        costs = measure(cfg, args.precisions, args.repeats, args.tasks, args.learner_calls, not args.no_dask)
    s = setting(cfg, args.cores)
    pred = predict(costs, s, args.env_steps)
    _table(costs, pred, s)
    if args.out:
        record = {"schema": SCHEMA, "config": args.config, "overrides": args.set, "setting": s,
                  "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "load_average": os.getloadavg(), "costs": costs, "prediction": pred}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
