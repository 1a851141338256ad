"""Stages as plain functions: what every executor schedules.

    quantize  : learner network -> versioned TFLite payload     (core.quantize)
    rollout   : actor envs x payload -> TrajectoryBatch          (core.rollout; a worker's actors
                one task a block: run_rollout_group)
    write     : several rollout results -> one replay shard      (write_shard_stage)
    commit    : shard ids -> one atomic commit-log entry         (commit_stage)
    learn     : committed replay -> K gradient steps             (learn_stage)
    evaluate  : payload -> returns of N episodes                 (core.policy_evaluation)
    checkpoint: learner state -> async zarr checkpoint           (core.checkpoint)

Functions that run on workers take only picklable, small arguments (URLs,
specs, payload references) and import nothing heavy: actors never import
TensorFlow.
"""
from __future__ import annotations

import base64
import threading
import time
import zlib
from collections import OrderedDict
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from core.policy_evaluation import run_evaluation_task
from core.rollout import run_rollout_group, run_rollout_task
from pipelines.run.task_stats import task_summary

__all__ = ["run_rollout_task", "run_rollout_group", "run_evaluation_task", "write_shard_stage", "commit_stage", "gc_stage",
           "learn_stage", "shard_id_for", "actor_states", "encode_state", "state_text"]


def shard_id_for(seq: int) -> str:
    """Deterministic shard id of the ``seq``-th shard of a run (attempt-independent)."""
    return f"s{seq:08d}"


def write_shard_stage(store_url: str, shard_id: str, results: Sequence[Any],
                      writer_options: Dict[str, Any] | None = None) -> Dict[str, Any]:
    """Aggregate the batches of several rollout tasks into one uncommitted shard.

    ``results``: rollout results, stored in their order, or lists of them
    (:func:`core.rollout.run_rollout_group`), stored in the plan's order (:func:`shard_order`).

    A retry overwrites its own uncommitted shard; nothing is visible until
    :func:`commit_stage` names it in the commit log. ``writer_options``:
    ``cfg.replay.writer_options()`` (chunk size, encoder threads).

    Returns metadata only, which is all the driver receives (data flows one
    way: executors hand this task the rollout futures, so trajectories go
    from the actor's worker to the writer's): shard id, rows, stored bytes,
    ``raw_bytes`` (the batches' in-memory size), ``write_s`` (this write's seconds), the episodes that ended
    (count, sum of returns, the last :data:`~pipelines.run.task_stats.RETURNS_TAIL` returns) and one
    ``[actor, task, worker, seconds, env_steps, policy_version]`` row per task.

    Tasks run with ``capture_state=True`` (each actor's last task of the
    block) hand their actor's state document to the shard: its attrs hold
    ``{ACTOR_STATES_ATTR: {actor: document}}`` (see :func:`actor_states`).
    """
    t0 = time.perf_counter()
    store = _worker_store(store_url, writer_options or {})
    results = shard_order(results)
    batches = [r.batch for r in results]
    attrs = {"tasks": [b.task_id for b in batches], "actors": sorted({int(b.actor_id) for b in batches})}
    states = {str(r.batch.actor_id): encode_state(r.actor_state) for r in results
              if getattr(r, "actor_state", None) is not None}
    if states:      # committed with the shard, so a resume finds the states of its last committed block
        attrs[ACTOR_STATES_ATTR] = states
    info = store.write_shard(shard_id, batches, attrs=attrs)
    return {"shard_id": shard_id, "rows": int(sum(b.size for b in batches)),
            "write_s": round(time.perf_counter() - t0, 6),     # the summary's wall split (storage)
            "nbytes": int(getattr(info, "nbytes", 0)), "raw_bytes": int(sum(b.nbytes for b in batches)),
            **task_summary([r.stats for r in results if getattr(r, "stats", None) is not None])}


def shard_order(results: Sequence[Any]) -> List[Any]:
    """``results`` as they come, or, where any item is the list of a :func:`core.rollout.run_rollout_group`
    (groups come worker by worker), flattened into the plan's order (actor-major: ``TrainingPlan.tasks``)."""
    if not any(isinstance(item, list) for item in results):
        return list(results)
    flat = [r for item in results for r in (item if isinstance(item, list) else [item])]
    return sorted(flat, key=lambda r: (int(r.batch.actor_id), r.batch.task_id))


#: Shard attribute holding the actors' state documents after the block (core.rollout, ``--resume``).
ACTOR_STATES_ATTR = "actor_states"


def encode_state(doc: Dict[str, Any]) -> Dict[str, Any]:
    """An actor state document as stored: ``{"zlib": base64}`` of its JSON (~13 KB -> ~3 KB for 8
    CartPole envs: most of it is repeated structure), or ``{"unsupported": reason}`` as it is."""
    if "unsupported" in doc:
        return dict(doc)
    from core.actor_state import dumps
    return {"zlib": base64.b64encode(zlib.compress(dumps(doc).encode(), 1)).decode("ascii")}


def state_text(stored: Any) -> str:
    """The JSON text of a stored document (:func:`encode_state`); ValueError if it is not one."""
    if not isinstance(stored, dict) or not isinstance(stored.get("zlib"), str):
        raise ValueError("not a stored actor state ({'zlib': base64})")
    try:
        return zlib.decompress(base64.b64decode(stored["zlib"], validate=True)).decode()
    except (ValueError, zlib.error, UnicodeDecodeError) as e:
        raise ValueError(f"its compressed bytes are damaged: {e}") from None


def actor_states(store, shard_id: str) -> Dict[str, Any]:
    """``{actor (str): stored state}`` of committed shard ``shard_id`` ({} if none were; see
    :func:`encode_state`, :func:`state_text`)."""
    from core.replay.shard_reader import read_shard_attrs
    attrs = read_shard_attrs(store.shards_url, shard_id) or {}
    return dict((attrs.get("attrs") or {}).get(ACTOR_STATES_ATTR) or {})


# Shard writers of this process (a worker, or the driver), most recently used last. A writer
# keeps its host buffers (core/replay/buffers.py) and encoder threads, so the next shard this
# process writes does not page-fault fresh memory. Only writers are kept, not stores: a store
# is opened per task, so it always reads the commit log as it is now.
_WRITERS: "OrderedDict[Tuple[str, str, Tuple], Any]" = OrderedDict()
_WRITERS_LOCK = threading.Lock()
_MAX_WRITERS = 4


def _worker_store(store_url: str, writer_options: Dict[str, Any]):
    """``ReplayStore.open(store_url)`` with this process's writer for it."""
    from core.replay import ReplayStore
    store = ReplayStore.open(store_url, **writer_options)
    key = (store.shards_url, store.env_id, tuple(sorted(writer_options.items())))
    with _WRITERS_LOCK:
        writer = _WRITERS.pop(key, None) or store.writer
        _WRITERS[key] = writer
        while len(_WRITERS) > _MAX_WRITERS:
            _WRITERS.popitem(last=False)
    store.writer = writer
    return store


def commit_stage(store, shard_ids: List[str], meta: Dict[str, Any] | None = None,
                 retention_transitions: int = 0) -> int:
    """Make ``shard_ids`` visible atomically; idempotent. Returns the log version.

    With ``retention_transitions > 0`` the oldest committed shards beyond
    that many rows are then removed (FIFO), which is itself a log entry;
    their data is deleted later by :func:`gc_stage`.
    """
    version = store.commit(list(shard_ids), meta=meta or {})
    # Latest state (cached by the log): no replay of every entry on each commit.
    if retention_transitions and store.state().rows > retention_transitions:
        version = store.apply_retention(retention_transitions)
    return version


def gc_stage(store, grace_seconds: float) -> Dict[str, int]:
    """Delete data of removed shards and of uncommitted shards older than ``grace_seconds``."""
    report = store.gc(grace_seconds)
    return {"removed": len(report.removed), "uncommitted": len(report.uncommitted)}


def learn_stage(learner, sampler, steps: int, batch_size: int, rng: np.random.Generator) -> Dict[str, float]:
    """``steps`` gradient steps on n-step batches sampled from committed replay.

    All ``steps`` batches are drawn in one sampler call and trained in one
    learner call (``[steps, batch_size]``), which removes per-step overhead.
    With a prioritized sampler the batches are drawn one step at a time so
    that every step sees the priorities its predecessor updated.
    """
    if hasattr(sampler, "update_priorities"):
        losses, qs = [], []
        for _ in range(steps):
            batch = sampler.sample(batch_size, rng)
            m = learner.step(batch)
            sampler.update_priorities(batch["index"], m["td_abs"] + 1e-6)
            losses.append(m["loss"])
            qs.append(m["q_mean"])
        return {"loss": float(np.mean(losses)), "q_mean": float(np.mean(qs))}
    flat = sampler.sample(steps * batch_size, rng)
    batch = {k: v.reshape((steps, batch_size) + v.shape[1:]) for k, v in flat.items()}
    m = learner.step(batch)
    return {"loss": m["loss"], "q_mean": m["q_mean"]}
