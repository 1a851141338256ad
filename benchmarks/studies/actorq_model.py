"""The cost model of an ActorQ run: whole-run env steps/s from measured per-step costs.

:mod:`benchmarks.studies.actorq_costs` measures the costs; this module turns them and a
config into predictions (no measuring here, so it is exact arithmetic to test)::

    s = setting(cfg, cores=2)
    pred = predict(costs, s)          # {precision: {"env_steps_per_s", "bound", "run": {...}, ...}}

Costs per env step, for precision ``p`` (wall ``t``, CPU ``c``)::

    A_p = t_rollout,p                       one actor task's time per env step (1 thread)
    S   = t_write                           shard write (a worker task in Dask runs)
    K   = t_commit                          commit + cache refresh (the driver)
    t_learn                                 one learner step (agent.batch_size)
    V_p = t_q,p + t_bcast,p                 one policy version on the driver's path:
                                            t_q = patch if the precision is patchable, else convert

Steady state (``predict``'s ``env_steps_per_s``): three resources bound the run::

    X_actors  = W / (A_p + S)               W = min(N, workers) actor processes in parallel
    X_learner = 1 / (r * t_learn + K + O / R + v * V_p)
                                            r = learner.replay_ratio, v = min(r / P, 1 / R) versions per
                                            env step (P = actors.broadcast_period, at most one per block),
                                            O: the driver's per-block submit and fetch (below)
    X_cpu     = C / (c_A,p + c_S + c_K + r * c_learn + v * c_V,p)     all CPU over C cores
    X_p       = min(X_actors, X_learner, X_cpu)

A finite run (``predict``'s ``run``, what the validation compares) is the
driver's block pipeline (:mod:`pipelines.run.plan`) played out with those costs.
Block ``b`` holds ``R`` env steps; with ``lag = actors.policy_lag``::

    roll_end[b]  = max(roll_end[b-1], learn_end[b-1-lag]) + ceil(N/W) * (R/N) * A_p
    write_end[b] = roll_end[b] + R * S + D            D: a block's Dask round trip (where measured),
                                                      less the driver's part of it (O)
    commit[b]    = max(write_end[b], learn_end[b-1]) + R * K * x + O
                                                      x: the learner thread's slowdown; O: the driver
                                                      thread's own work per block: its submit calls (times x)
                                                      and fetching the write's result (measured from
                                                      workers busy with rollouts, as often as they are)
    learn_end[b] = commit[b] + (target(b) - target(b-1)) * t_learn + [version due] * V_p
                   + [first call shape] * t_trace + [second] * t_retrace  (tf.function, reduce_retracing)

(S and K per shard where measured per shard: a small-row shard's cost is fixed; blocks 0..W-1 write
with S_first, a fresh worker's first write, which pays the write engine's imports, where measured.)
    T            = learn_end[last]          target(b) = floor(r * rows(<= b)), 0 below min_size

with each per-step wall time scaled by the run's CPU contention: the costs were
measured one thread at a time among M other runnable threads (from wall / CPU
at measuring time), the run puts ``k = W u_A + T_l u_L`` of its own threads
beside them (``u``: busy fractions from the pipeline itself; ``simulate``).

So actors and learner overlap (``max``) in the middle of the run and add up
(``sum``) in its first block (nothing to learn from yet) and its last one
(nothing left to act for): with few blocks a run is slower than its steady
state. Amdahl's law is the ``X_cpu`` case: with ``f`` the actor share of fp32's
CPU per env step and ``s`` the inference speedup of ``p``,
``X_p / X_fp32 = 1 / ((1 - f) + f / s)``; when the learner binds, int8 changes
nothing (ratio 1).

Ignored: contention between our own threads beyond CPU seconds (cache, memory
bandwidth) where no co-run costs were measured, evaluations, periodic checkpoints, start-up and the end-of-run
checkpoint (the validation compares the driver loop's own wall time).
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, Optional


def setting(cfg, cores: Optional[int] = None) -> Dict[str, Any]:
    """The config values the model reads."""
    from pipelines.run.plan import TrainingPlan
    workers = cfg.dask.n_workers or cores or os.cpu_count() or 1
    plan = TrainingPlan.from_config(cfg)
    return {"replay_ratio": cfg.learner.replay_ratio, "num_actors": cfg.actors.num_actors,
            "num_envs": cfg.env.num_envs, "broadcast_period": cfg.actors.broadcast_period,
            "workers": workers if cfg.executor == "dask" else 1,
            "cores": cores or os.cpu_count() or 1, "budget_env_steps": cfg.total_env_steps,
            "executor": cfg.executor, "block_rows": plan.block_rows, "policy_lag": plan.policy_lag,
            "min_size": plan.min_size, "batch_size": cfg.agent.batch_size, "steps_per_call": plan.steps_per_call,
            "learner_threads": cfg.threads.tf_intra_op or cores or os.cpu_count() or 1}


def _version(v: Dict[str, Any]) -> tuple:
    """(wall s, CPU s) of one policy version on the driver's path."""
    patched = v["patch_s"] is not None
    wall = (v["patch_s"] if patched else v["convert_s"]) + (v.get("bcast_s") or 0.0)
    cpu = (v["patch_cpu_s"] if patched else v["convert_cpu_s"]) + (v.get("bcast_cpu_s") or 0.0)
    return wall, cpu


def steady_bounds(c: Dict[str, Any], storage: Dict[str, Any], learner: Dict[str, Any],
                  s: Dict[str, Any]) -> Dict[str, float]:
    """``{actors, learner, cpu}``: env steps/s each resource allows at steady state."""
    r, n, period = s["replay_ratio"], s["num_actors"], s["broadcast_period"]
    w = min(n, s["workers"])
    v_wall, v_cpu = _version(c["version"])
    # Versions per env step: r / P, but at most one per learner block (published at block ends).
    per = min(r / period, 1.0 / s["block_rows"]) if "block_rows" in s else r / period
    q_cpu = per * (v_cpu + n * c["version"]["load_cpu_s"])
    a, c_a = c["rollout"]["wall_s"], c["rollout"]["cpu_s"]
    # The driver thread's own per-block work (submit calls, result fetch), per env step.
    o = (storage.get("driver_submit_s", 0.0) + storage.get("driver_gather_s", 0.0)) / s.get("block_rows", 1)
    return {"actors": w / (a + storage["write_s"]),
            "learner": 1.0 / (r * learner["wall_s"] + storage["commit_s"] + o + per * v_wall),
            "cpu": s["cores"] / (c_a + storage["write_cpu_s"] + storage["commit_cpu_s"] + r * learner["cpu_s"]
                                 + q_cpu)}


def contention(costs_p: Dict[str, Any], learner: Dict[str, Any], cores: int) -> float:
    """M: other runnable threads on the machine while costs were measured (processor sharing).

    One thread of ours then ran at ``sigma = wall / cpu = max(1, (M + 1) / C)``, so
    ``M = C * sigma - 1`` when ``sigma > 1`` (0 otherwise: an idle machine cannot tell
    0 from C - 1 others). ``sigma`` pools the rollout and learner measurements.
    """
    wall = costs_p["rollout"]["wall_s"] + learner["wall_s"]
    cpu = costs_p["rollout"]["cpu_s"] + learner["cpu_s"]
    sigma = wall / cpu if cpu > 0 else 1.0
    return cores * sigma - 1.0 if sigma > 1.0 else 0.0


def _pipeline(a_step: float, l_step: float, trace: tuple, c: Dict[str, Any], storage: Dict[str, Any],
              s: Dict[str, Any], env_steps: int, driver_scale: float = 1.0,
              gather_extra: float = 0.0) -> Dict[str, Any]:
    """The block pipeline with given per-step wall times: time, busy seconds and critical path.

    ``driver_scale``: the slowdown of the driver thread's own per-block work
    (commit, cache refresh, submit calls), the learner's thread, so the
    learner's slowdown. ``storage["dispatch_s"]`` (where measured): a block's
    Dask round trip, from its rollouts ending to the driver holding its shard
    write's result; its own submit calls (``dispatch_submit_s``) and result
    fetch (``driver_gather_s``) are taken out of it, and the block's real
    submits (``driver_submit_s``) and the fetch run on the driver's thread,
    serial with its learner steps. ``gather_extra``: how much
    longer fetching the write's result takes from workers busy with rollouts.
    """
    big_r, n = s["block_rows"], s["num_actors"]
    w = min(n, s["workers"])
    blocks = max(1, math.ceil(env_steps / big_r))
    a_blk = math.ceil(n / w) * (big_r / n) * a_step
    s_blk = storage.get("write_shard_s", big_r * storage["write_s"])      # per shard where measured
    # A fresh worker's first shard write pays its imports (where measured): blocks 0..W-1 each write on
    # a worker that has not written yet.
    s_first = max(s_blk, storage.get("first_write_shard_s", s_blk))
    k_blk = storage.get("commit_shard_s", big_r * storage["commit_s"]) * driver_scale
    o_blk = storage.get("driver_submit_s", 0.0) * driver_scale + storage.get("driver_gather_s", 0.0) + gather_extra
    # The round trip less its own submit and fetch (on the driver path above): scheduling and the workers'
    # hand-offs. Cost files from before dispatch_submit_s was measured take the block's submits instead.
    d_submit = storage.get("dispatch_submit_s", storage.get("driver_submit_s", 0.0))
    d_blk = max(0.0, storage.get("dispatch_s", 0.0) - d_submit - storage.get("driver_gather_s", 0.0))
    v_wall = _version(c["version"])[0]
    target = lambda b: 0 if (b + 1) * big_r < s["min_size"] else int(s["replay_ratio"] * (b + 1) * big_r)
    roll_end, learn_end = [], []
    rolls, learns = [], []       # (start, end) of each block's rollouts and of its learner steps
    steps = last_bcast = versions = 0
    shapes: set = set()          # learner call sizes seen: the first two trace tf.function (reduce_retracing)
    path = {"learner": 0.0, "actors": 0.0, "storage": 0.0, "broadcast": 0.0, "driver": 0.0}
    for b in range(blocks):
        pb = b - 1 - s["policy_lag"]
        ready = learn_end[pb] if pb >= 0 else 0.0
        roll_start = max(roll_end[-1] if roll_end else 0.0, ready)
        roll_end.append(roll_start + a_blk)
        s_b = s_first if b < w else s_blk
        # The workers are busy from a block's rollouts to its shard write (both run on them).
        if rolls and roll_start <= rolls[-1][1]:
            rolls[-1] = (rolls[-1][0], max(rolls[-1][1], roll_end[-1] + s_b))
        else:
            rolls.append((roll_start, roll_end[-1] + s_b))
        write_end = roll_end[-1] + s_b + d_blk
        prev = learn_end[-1] if learn_end else 0.0
        path["actors"] += max(0.0, roll_end[-1] - prev)
        path["storage"] += max(0.0, write_end - max(prev, roll_end[-1])) + k_blk
        path["driver"] += o_blk
        commit = max(write_end, prev) + k_blk + o_blk
        n_new, per = target(b) - steps, s["steps_per_call"]
        traced = min(len(shapes), 2)
        shapes.update([per] * (n_new // per) + ([n_new % per] if n_new % per else []))
        learn = n_new * l_step + sum(trace[i] for i in range(traced, min(len(shapes), 2)))
        steps = target(b)
        version = v_wall if steps - last_bcast >= s["broadcast_period"] else 0.0
        if version:
            last_bcast, versions = steps, versions + 1
        path["learner"] += learn
        path["broadcast"] += version
        learns.append((commit, commit + learn))
        learn_end.append(commit + learn + version)
    both = _overlap(rolls, learns)
    return {"time_s": learn_end[-1], "env_steps": blocks * big_r, "blocks": blocks, "learner_steps": steps,
            "versions": versions, "actor_busy_s": blocks * a_blk, "learner_busy_s": path["learner"], "path": path,
            "overlap": {"learner": both / path["learner"] if path["learner"] > 0 else 0.0,
                        "actors": both / (blocks * a_blk) if a_blk > 0 else 0.0}}


def _overlap(a: list, b: list) -> float:
    """Total length of the intersection of two lists of disjoint, start-ordered intervals."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def simulate(c: Dict[str, Any], storage: Dict[str, Any], learner: Dict[str, Any], s: Dict[str, Any],
             env_steps: int, iterations: int = 8, others: Optional[float] = None) -> Dict[str, Any]:
    """A run of ``env_steps`` (module docstring): the block pipeline at the run's own CPU contention.

    The costs were measured one thread at a time among ``M`` (:func:`contention`)
    other threads; in the run ``k = W * u_actors + T_l * u_learner`` of our threads
    compete (``u``: busy fractions, ``T_l`` = learner threads), so per-step wall
    times scale by ``max(1, (M + k) / C) / max(1, (M + 1) / C)``. Where the costs
    hold a co-run measurement (``c["corun"]``: learner and actors measured
    running side by side), that replaces the scaling for our own threads:
    ``t_learn = t_alone + o_learner * (t_corun - t_alone)`` and likewise for the
    actors with ``o_actors``, where ``o`` is the fraction of that side's busy time
    the pipeline overlaps with the other side's (the block schedule correlates
    them: a block's learner steps run while the next block's rollouts do), since
    CPU seconds miss the caches and memory bandwidth the two share; the workers count
    as busy from a block's rollouts to the end of its shard write, which runs on
    them too. ``u`` and the
    pipeline are solved together by fixed-point iteration (``iterations`` rounds).
    ``others``: the other users' runnable threads during the run, where known
    (e.g. from the load average); the per-step costs are then scaled from their
    own measuring-time contention to ``others``.
    """
    m0, cores = contention(c, learner, s["cores"]), s["cores"]
    m = m0 if others is None else max(0.0, others)
    w, t_l = min(s["num_actors"], s["workers"]), s.get("learner_threads", 1)
    base = max(1.0, (m0 + 1) / cores)
    # Rollouts measured on the run's W workers at once already carry their own contention.
    par = c.get("rollout_parallel")
    # As the chains ran (the dispatch gaps between an actor's tasks included) where measured.
    a_wall, a_base = ((par.get("chain_wall_s", par["wall_s"]), max(1.0, (m0 + par["workers"]) / cores)) if par
                      else (c["rollout"]["wall_s"], base))
    traces = (learner.get("trace_s", 0.0), learner.get("retrace_s", 0.0))
    co = c.get("corun") if (c.get("corun") or {}).get("learner_wall_s") else None
    u_a = u_l = o_a = o_l = 1.0
    for _ in range(iterations):
        if co:
            # Measured side by side (actorq_costs ``corun``): our own contention is in the costs,
            # felt as often as the other side runs; only others' load scales (m0 -> m).
            g = max(1.0, (m + 1) / cores) / base
            l_step = (learner["wall_s"] + o_l * (co["learner_wall_s"] - learner["wall_s"])) * g
            a_step = (a_wall + o_a * (co.get("chain_wall_s", co["rollout_wall_s"]) - a_wall)) * g
            # Fetching a result from busy workers (measured beside the rollouts) as often as they are busy.
            busy_fetch = co.get("gather_wall_s")
            extra = o_a * max(0.0, busy_fetch - storage.get("driver_gather_s", 0.0)) if busy_fetch else 0.0
            run = _pipeline(a_step, l_step, tuple(x * l_step / learner["wall_s"] for x in traces),
                            c, storage, s, env_steps, driver_scale=l_step / learner["wall_s"], gather_extra=extra)
        else:
            load = max(1.0, (m + w * u_a + t_l * u_l) / cores)
            g = load / base
            run = _pipeline(a_wall * load / a_base, learner["wall_s"] * g, tuple(x * g for x in traces),
                            c, storage, s, env_steps, driver_scale=g)
        t = run["time_s"]
        u_a, u_l = min(1.0, run["actor_busy_s"] / t), min(1.0, run["learner_busy_s"] / t)
        o_l, o_a = run["overlap"]["learner"], run["overlap"]["actors"]
    path = run.pop("path")
    return {**run, "env_steps_per_s": run["env_steps"] / t, "contention_others": m, "slowdown": g,
            "utilization": {"actors": u_a, "learner": u_l},
            "bound": "learner" if path["learner"] + path["broadcast"] >= path["actors"] + path["storage"]
            else "actors",
            "share": {k: v / t if t > 0 else 0.0 for k, v in path.items()}}


def predict(costs: Dict[str, Any], s: Dict[str, Any], env_steps: Optional[int] = None) -> Dict[str, Any]:
    """Per precision: steady-state env steps/s and bound, the finite ``run``, and the ratios to fp32."""
    sto, lrn = costs["storage"], costs["learner"]
    e = env_steps or s["budget_env_steps"]
    out = {}
    for p, c in costs["precisions"].items():
        bounds = steady_bounds(c, sto, lrn, s)
        x = min(bounds.values())
        out[p] = {"env_steps_per_s": x, "bound": min(bounds, key=bounds.get), "bounds": bounds,
                  "time_s": e / x, "version_s": c["version"]["patch_s"] if c["version"]["patch_s"] is not None
                  else c["version"]["convert_s"]}
        if "block_rows" in s:
            out[p]["run"] = simulate(c, sto, lrn, s, e)
    base = out.get("fp32")
    for p in out:
        out[p]["speedup_vs_fp32"] = out[p]["env_steps_per_s"] / base["env_steps_per_s"] if base else None
        if base and "run" in out[p]:
            out[p]["run"]["speedup_vs_fp32"] = out[p]["run"]["env_steps_per_s"] / base["run"]["env_steps_per_s"]
    return out
