"""End-of-run summary and per-worker stats, shared by every executor.

The continuous driver (:mod:`pipelines.run.driver`, local and dask executors)
and the round-based Beam launcher (:mod:`pipelines.beam.rounds`) finish a run the
same way, so their summaries have the same keys and ``print_summary`` reads
either::

    restore_best(best_ckpt, loop.best_version, learner)      # best evaluated params, if any
    final = final_evaluation(cfg, learner, builder, run_dir, loop.policy_version, calib)
    summary = build_summary(cfg, run_dir, loop, learner.steps, wall_s, payload_bytes, lags, final, log_version)
    write_summary(run_dir, log, summary)                     # metrics.jsonl + summary.json (+ wall_split)

:class:`WorkerStats` aggregates rollout stats per worker (tasks done,
retries, env steps/s) for progress bars and ``workers`` metrics records.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, Optional, Sequence

import numpy as np

from core import urls


def process_start() -> float:
    """Wall-clock time this process started (time-to-target counts from here; :mod:`core.process_clock`)."""
    from core.process_clock import process_start_time
    return process_start_time()


def evaluation_score(result: Dict[str, Any]) -> float:
    """An evaluation's score: the confirmed mean when a confirmation ran, else the mean."""
    return result["confirmed_mean"] if result["confirmed_mean"] is not None else result["mean"]


def log_evaluation(log, loop, result: Dict[str, Any]) -> None:
    """One ``eval`` record in metrics.jsonl (wall time from process start)."""
    log.write("eval", step=result.get("env_steps", loop.env_steps), version=result["version"], mean=result["mean"],
              std=result["std"], min=result["min"], confirmed_mean=result["confirmed_mean"],
              wall_s=time.time() - process_start())


def record_target(cfg, loop, result: Dict[str, Any]) -> bool:
    """Note time and env steps to target the first time an evaluation is solved; True = stop now.

    Solved: the score reaches ``eval.target_return`` and, when confirmation is
    on, a confirmation ran (see ``core.policy_evaluation.run_evaluation_task``).
    """
    solved = evaluation_score(result) >= cfg.eval.target_return and (
        result["confirmed_mean"] is not None or cfg.eval.confirm_episodes == 0)
    if solved and loop.time_to_target_s is None:
        loop.time_to_target_s = time.time() - process_start()
        loop.env_steps_to_target = result.get("env_steps", loop.env_steps)   # where it was planned
    return bool(cfg.eval.stop_at_target and solved)


def restore_best(best_ckpt, best_version: int, learner) -> bool:
    """Load the best evaluated parameters (if any were kept) into ``learner``; True if it did."""
    if best_ckpt.latest_step() is None or best_version < 0:
        return False
    state, _ = best_ckpt.restore(best_ckpt.latest_step())
    learner.restore({**learner.state(), "params": state["params"]})
    return True


def final_evaluation(cfg, learner, builder, run_dir: str, policy_version: int,
                     calibration_obs: Optional[np.ndarray]) -> Dict[str, Dict[str, Any]]:
    """Evaluate ``learner``'s policy at fp32 and at the actors' precision; save the actors' flatbuffer.

    Returns ``{precision: {"mean", "std", "payload_bytes"}}``.
    """
    from core.policy_evaluation import evaluate_payload
    from core.quantize import PolicyQuantizer
    final: Dict[str, Dict[str, Any]] = {}
    precisions = ["fp32"] + ([cfg.actors.precision] if cfg.actors.precision != "fp32" else [])
    for precision in precisions:
        payload = PolicyQuantizer(precision).quantize(
            learner.policy_model, version=policy_version,
            calibration_obs=calibration_obs if precision == "int8-full" else None)
        returns = evaluate_payload(payload, cfg.env.id, cfg.eval.episodes, seed=cfg.seed + 900_000,
                                   selector=builder.action_selector, max_episode_steps=cfg.env.max_episode_steps,
                                   frame_stack=getattr(cfg.agent, "frame_stack", 1))
        final[precision] = {"mean": float(returns.mean()), "std": float(returns.std()),
                            "payload_bytes": int(payload.nbytes)}
        if precision == cfg.actors.precision:
            fs, path = urls.resolve(run_dir)
            with fs.open(f"{path}/policy-{precision}.tflite", "wb") as f:
                f.write(payload.data)
    return final


def build_summary(cfg, run_dir: str, loop, learner_steps: int, wall_s: float, bytes_per_broadcast: int,
                  lags: Sequence, final: Dict[str, Any], replay_log_version: int,
                  driver_bytes_in: Optional[int] = None, trajectory_bytes: Optional[int] = None) -> Dict[str, Any]:
    """The summary dict (same keys for every executor). ``lags``: (versions, seconds) pairs.

    ``driver_bytes_in``: bytes of the task results this driver (or Beam launcher) process received;
    ``trajectory_bytes``: in-memory bytes of the committed batches; both per env step, None
    where the loop does not measure them.
    """
    per_step = lambda n: None if n is None else n / max(loop.env_steps, 1)
    return {
        "driver_bytes_in_per_env_step": per_step(driver_bytes_in),
        "trajectory_bytes_per_env_step": per_step(trajectory_bytes),
        "run_dir": run_dir, "env_id": cfg.env.id, "executor": cfg.executor,
        "precision": cfg.actors.precision, "seed": cfg.seed,
        "env_steps": loop.env_steps, "learner_steps": learner_steps,
        "episodes": loop.episodes, "wall_s": wall_s,
        "env_steps_per_s": loop.env_steps / max(wall_s, 1e-9),
        "policy_versions": loop.policy_version,
        "bytes_per_broadcast": int(bytes_per_broadcast),
        "best_eval_return": loop.best_return, "best_version": loop.best_version,
        "time_to_target_s": loop.time_to_target_s, "env_steps_to_target": loop.env_steps_to_target,
        "mean_policy_lag_versions": float(np.mean([l[0] for l in lags])) if lags else 0.0,
        "mean_policy_lag_s": float(np.mean([l[1] for l in lags])) if lags else 0.0,
        "final_eval": final, "replay_log_version": int(replay_log_version),
    }


#: The parts of :func:`wall_split`, in the order it reports them.
SPLIT_PARTS = ("learner", "actors", "broadcast", "storage", "evaluation", "checkpoint", "other")


def wall_split(records: Sequence[Dict[str, Any]], wall_s: float) -> Optional[Dict[str, Any]]:
    """Where the run's wall time went, from its own metrics records; None without a ``schedule`` record.

    The driver thread is the run's critical path: it trains, commits and
    publishes versions itself, and waits for the rest. Its ``schedule`` record
    (busy seconds per loop phase, idle seconds by what it waited for) is split
    into a partition of ``wall_s``::

        learner    = stage learn_stage                the learner stage's training seconds
        broadcast  = stage new_version + busy new_version   quantize / patch (in the stage), publish
                                                      (``stage_s``: measured by the stage, wherever it runs;
                                                      an in-process stage runs inside the driver's ``learn``)
        checkpoint = busy checkpoint
        evaluation = idle evaluation + busy (end_block - new_version - checkpoint)
                                                      (the local executor evaluates inside end_block)
        wait       = idle shard + busy submit         waiting for rollouts and shard writes (the local
                                                      executor runs both inside submit)
        actors     = wait * a / (a + w)               a = rollout task seconds / P, P = workers that ran
        storage    = busy commit + wait * w / (a + w)     tasks; w = shard write seconds (commit records);
                     + stage refresh_cache            the learner's replay cache refresh before each block
        other      = wall_s - the rest                loop overhead, idle other, end of run

    Rollouts of a block run on P workers at once and its write follows them, so
    ``a`` and ``w`` are the block's critical path per part. ``busy_s`` adds the
    seconds each resource worked, overlapped or not: ``actor_tasks`` (summed over
    workers), ``shard_writes``, ``learner``. Only records after the last ``config``
    record count (a resumed run appends a new segment).
    """
    starts = [i for i, r in enumerate(records) if r.get("kind") == "config"]
    records = records[starts[-1]:] if starts else records     # this segment of a resumed run
    sched = next((r for r in reversed(records) if r.get("kind") == "schedule"), None)
    if sched is None:
        return None
    busy, idle = sched.get("busy_s", {}), sched.get("idle_s", {})
    b = lambda k: float(busy.get(k, 0.0))
    stage = sched.get("stage_s", {})
    learner_s = float(stage.get("learn_stage", busy.get("learn_stage", 0.0)))
    broadcast_s = float(stage.get("new_version", 0.0)) + b("new_version")
    workers = next((r["workers"] for r in reversed(records) if r.get("kind") == "workers"), {})
    task_s = sum(w["env_steps"] / w["env_steps_per_s"] for w in workers.values() if w["env_steps_per_s"] > 0)
    write_s = sum(float(r.get("write_s") or 0.0) for r in records if r.get("kind") == "commit")
    a, w = task_s / max(len(workers), 1), write_s
    wait = float(idle.get("shard", 0.0)) + b("submit")
    share = a / (a + w) if a + w > 0 else 1.0
    parts = {"learner": learner_s, "actors": wait * share, "broadcast": broadcast_s,
             "storage": b("commit") + wait * (1.0 - share) + float(stage.get("refresh_cache", 0.0)),
             "evaluation": float(idle.get("evaluation", 0.0)) + max(
                 0.0, b("end_block") - b("new_version") - b("checkpoint")),
             "checkpoint": b("checkpoint")}
    parts["other"] = wall_s - sum(parts.values())
    return {"seconds": {k: parts[k] for k in SPLIT_PARTS},
            "share": {k: parts[k] / wall_s if wall_s > 0 else 0.0 for k in SPLIT_PARTS},
            "busy_s": {"actor_tasks": task_s, "shard_writes": write_s, "learner": learner_s},
            "actor_workers": len(workers), "wall_s": wall_s}


def run_clock(records: Sequence[Dict[str, Any]], wall_s: float, now: Optional[float] = None) -> Dict[str, Any]:
    """The run on one clock, from process start, in parts that add up::

        since_process_start_s = startup_s + training_loop_s + end_of_run_s

    ``startup_s``: process start (imports, config, cluster, stores, learner
    build) to the training loop's start; ``training_loop_s``: the loop's wall
    time (``wall_s``: env steps/s divide by it); ``end_of_run_s``: the loop's
    end to now (final evaluation at fp32 and the actors' precision, the
    summary). The loop's end is the driver's ``schedule`` record (after the
    last ``config`` record: a resumed run's own segment); without one (the Beam
    launcher) it is not known, and ``startup_s`` and ``end_of_run_s`` are None
    with ``startup_and_end_s`` their sum. ``time_to_target_s`` counts from the
    same process start.
    """
    now = time.time() if now is None else now
    since = now - process_start()
    starts = [i for i, r in enumerate(records) if r.get("kind") == "config"]
    segment = records[starts[-1]:] if starts else records
    sched = next((r for r in reversed(segment) if r.get("kind") == "schedule"), None)
    clock = {"since_process_start_s": since, "startup_s": None, "training_loop_s": wall_s, "end_of_run_s": None,
             "startup_and_end_s": since - wall_s}
    if sched is not None and "time" in sched:
        clock["end_of_run_s"] = now - float(sched["time"])
        clock["startup_s"] = since - wall_s - clock["end_of_run_s"]
    return clock


def write_summary(run_dir: str, log, summary: Dict[str, Any]) -> None:
    """Record ``summary`` in metrics.jsonl and as ``<run_dir>/summary.json``.

    Adds ``wall_split`` (:func:`wall_split`) from the run's metrics.jsonl when
    the run's driver wrote a ``schedule`` record (None otherwise), and
    ``clock`` (:func:`run_clock`): start-up, training loop and end of run from
    process start.
    """
    from core.metrics import read_metrics
    try:
        records = read_metrics(run_dir)
    except (OSError, ValueError):   # a log this filesystem cannot read back: no split, the summary stays
        records = []
    summary["wall_split"] = wall_split(records, summary["wall_s"])
    summary["clock"] = run_clock(records, summary["wall_s"])
    log.write("summary", step=summary["env_steps"], **summary)
    fs, path = urls.resolve(run_dir)
    with fs.open(f"{path}/summary.json", "w") as f:
        json.dump(summary, f, indent=2)


class WorkerStats:
    """Per-worker rollout counters: tasks done, retries, env steps and env steps/s.

    A *retry* is counted on the worker that ran an actor's task when the
    actor's previous task ran on a different worker: the actor's env state
    was lost or moved (a worker died and its task was re-run elsewhere, or
    the scheduler moved the actor). Tasks that fail and re-run on the same
    worker are invisible here (Dask reports only the successful attempt).

    Example::

        ws = WorkerStats()
        ws.add(result.stats)               # a RolloutStats
        ws.table()["tcp://10.0.0.5:4001"]  # {"tasks": 12, "retries": 0, "env_steps": 3072, ...}
    """

    def __init__(self) -> None:
        self._rows: Dict[str, Dict[str, float]] = {}
        self._last_worker: Dict[int, str] = {}

    def add(self, stats) -> None:
        row = self._rows.setdefault(stats.worker, {"tasks": 0, "retries": 0, "env_steps": 0, "seconds": 0.0})
        row["tasks"] += 1
        row["env_steps"] += int(stats.env_steps)
        row["seconds"] += float(stats.seconds)
        previous = self._last_worker.get(stats.actor_id)
        if previous is not None and previous != stats.worker:
            row["retries"] += 1
        self._last_worker[stats.actor_id] = stats.worker

    def table(self) -> Dict[str, Dict[str, Any]]:
        """``{worker: {tasks, retries, env_steps, env_steps_per_s}}`` (steps/s while stepping)."""
        return {w: {"tasks": int(r["tasks"]), "retries": int(r["retries"]), "env_steps": int(r["env_steps"]),
                    "env_steps_per_s": r["env_steps"] / max(r["seconds"], 1e-9)}
                for w, r in sorted(self._rows.items())}

    def postfix(self) -> str:
        """Compact progress text: ``tasks/retries`` per worker, e.g. ``41/0 39/2``."""
        return " ".join(f"{int(r['tasks'])}/{int(r['retries'])}" for _, r in sorted(self._rows.items()))

    def __len__(self) -> int:
        return len(self._rows)
