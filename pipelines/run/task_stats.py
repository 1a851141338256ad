"""The rollout stats a shard write reports back to the driver: compact, and read back as rows.

The driver (and Beam's launcher) receive, per block, the tasks' ids, worker,
seconds, env steps and policy version (lags, the workers table, the progress
bar's returns), never trajectories. :func:`task_summary` packs them as columns
of small integers; :func:`tasks_of` reads them back. Light on purpose: Beam's
launcher imports it and must never import TensorFlow.

Example::

    info = task_summary([result.stats for result in results])     # in the shard-write task
    for actor, task, worker, seconds, env_steps, version in tasks_of(info):   # in the driver
        ...
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

#: Episode returns a shard write reports back (progress shows the mean of the last 20).
RETURNS_TAIL = 10


def task_summary(stats: Sequence[Any]) -> Dict[str, Any]:
    """What the driver needs of a shard's rollout stats, compactly (it is all the driver receives).

    The tasks go as columns of small integers, each worker's address once (``workers``) and seconds
    as whole milliseconds: ~20 pickled bytes a task instead of ~60 with an address and a float in each
    row, which kept a 4,096-row CartPole block's reply at 1.3% of its trajectory bytes (issue 30's
    bound is 1%). Read them back with :func:`tasks_of`.
    """
    returns = [r for s in stats for r in s.episode_returns]
    workers = list(dict.fromkeys(s.worker for s in stats))
    index = {w: i for i, w in enumerate(workers)}
    return {"episodes": len(returns), "return_sum": float(sum(returns)),
            "returns_tail": [round(r, 2) for r in returns[-RETURNS_TAIL:]], "workers": workers,
            "tasks": {"actor": [int(s.actor_id) for s in stats], "task": [int(s.task_index) for s in stats],
                      "worker": [index[s.worker] for s in stats], "ms": [round(1000 * s.seconds) for s in stats],
                      "steps": [int(s.env_steps) for s in stats], "version": [int(s.policy_version) for s in stats]}}


def tasks_of(info: Dict[str, Any]) -> List[Tuple[int, int, str, float, int, int]]:
    """``(actor, task, worker, seconds, env_steps, policy_version)`` per task of a :func:`task_summary`;
    also reads the row lists that records written before it kept (a Beam round resumed across the change)."""
    tasks = info.get("tasks")
    if not tasks:
        return []
    if isinstance(tasks, list):
        return [tuple(t) for t in tasks]
    workers = info["workers"]
    return [(a, t, workers[w], ms / 1000.0, n, v) for a, t, w, ms, n, v in
            zip(tasks["actor"], tasks["task"], tasks["worker"], tasks["ms"], tasks["steps"], tasks["version"])]
