"""Collect stage: rollout tasks that keep only episodes admitted to a dataset.

A collection runs rollout tasks until ``N`` episodes have ended, then must
stop without cutting episodes. Episode ids tell where an episode started:
the counter of an episode begun in task ``k`` is ``(k << 10) | i``
(``core.rollout``), so ``start_task(id) = (id & 0xffffffff) >> 10``. When
enough episodes have ended, the launcher fixes ``admit_before = K`` (the next
task index not yet submitted): every episode started in a task ``< K`` is
admitted; later episodes are dropped. Tasks ``>= K`` still run, until every
admitted episode has ended, and :func:`collect_rollout_task` trims their
batches to admitted rows. The dataset therefore holds complete episodes only.

Example::

    r = collect_rollout_task(spec, payload, k, 32, {"epsilon": 0.0}, admit_before=None)
    r.episodes_ended, r.open_start_tasks
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np

from core.rollout import RolloutResult, run_rollout_task


def start_task(episode_id: np.ndarray) -> np.ndarray:
    """The rollout task index an episode started in (see module docstring)."""
    return (np.asarray(episode_id, np.int64) & 0xFFFFFFFF) >> 10


@dataclasses.dataclass
class CollectResult(RolloutResult):
    episodes_ended: int = 0                 # admitted episodes whose last row is in this batch
    open_start_tasks: List[int] = dataclasses.field(default_factory=list)  # per env; -1 = ended at the end
    kept_rows: int = 0


def collect_rollout_task(spec, payload, task_index: int, num_steps: int, explore, admit_before: Optional[int]
                         ) -> CollectResult:
    """``run_rollout_task``, then drop rows of episodes started in tasks ``>= admit_before``."""
    result = run_rollout_task(spec, payload, task_index, num_steps, explore)
    b = result.batch
    last = b.terminated | b.truncated
    open_tasks = np.where(last[-1], -1, start_task(b.episode_id[-1]))
    keep = np.ones(last.shape, bool) if admit_before is None else start_task(b.episode_id) < admit_before
    batch = b
    if not keep.all():
        from core.dataset.shards import make_batch
        flat_keep = np.swapaxes(keep, 0, 1).reshape(-1)
        rows = {k: v[flat_keep] for k, v in b.flat_rows().items()}
        batch = make_batch(rows, b.env_id, b.actor_id, b.task_id, b.seed)
    return CollectResult(batch=batch, stats=result.stats, episodes_ended=int(np.count_nonzero(last & keep)),
                         open_start_tasks=[int(t) for t in open_tasks], kept_rows=int(keep.sum()))


def needs_more(open_start_tasks: List[int], admit_before: Optional[int]) -> bool:
    """Must the actor run another task? Yes while collecting, or while an admitted episode is open."""
    return admit_before is None or any(0 <= t < admit_before for t in open_start_tasks)
