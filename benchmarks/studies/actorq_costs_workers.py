"""ActorQ costs measured on Dask workers, as the run's actor workers see them: parallel and co-run
rollouts (:func:`measure_rollouts_parallel`), a block's empty task graph (:func:`block_round_trip`),
a fresh worker's first shard write (:func:`first_shard_writes`) and the payload broadcast, all on a
LocalCluster of the run's actor workers (:func:`measure_on_workers`).

:mod:`benchmarks.studies.actorq_costs` calls :func:`measure_on_workers` after the in-process costs
(:mod:`benchmarks.studies.actorq_costs_process`); ``--no-dask`` skips it.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional

from benchmarks.studies.actorq_costs_process import timed



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
    from core.actor import ActorSpec
    from core.rollout import release_actors, run_rollout_task
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
    CartPole run against ~0.03 s for every later write (docs/notebook/2026-11-results-history.md), a one-off
    cost that the in-process ``measure_storage``, whose process has imported them, never sees. Run before
    any other task on the workers; the shards stay uncommitted (invisible) in the tool's scratch store.
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
