"""ShardAggregator: group the small batches of several rollout tasks into one shard.

A rollout task of 8 envs x 128 CartPole steps is ~60 KB, far below an
efficient shard (the default target is 4 MiB). The aggregator buffers batches
in arrival order and emits a group as soon as the buffered raw bytes reach
``target_bytes``; ``flush()`` emits the remainder. Grouping depends only on
the order and sizes of the batches, so shard ids derived from the group index
(``<round>-g<index>``) are deterministic and retries are harmless.

Example::

    agg = ShardAggregator(target_bytes=4 << 20)
    groups = [g for batch in task_batches for g in agg.add(batch)] + agg.flush()
    for i, group in enumerate(groups):
        store.write_shard(f"r000003-g{i:04d}", group)
"""
from __future__ import annotations

from typing import List

from core.trajectory import TrajectoryBatch
from core.replay.schema import ReplayError


class ShardAggregator:
    """Buffers TrajectoryBatches and cuts them into groups of about ``target_bytes``."""

    def __init__(self, target_bytes: int = 4 << 20, max_batches: int = 100_000):
        if target_bytes <= 0:
            raise ReplayError(f"target_bytes={target_bytes} must be positive (e.g. 4 << 20)")
        self.target_bytes, self.max_batches = int(target_bytes), int(max_batches)
        self._pending: List[TrajectoryBatch] = []
        self._bytes = 0

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    def add(self, batch: TrajectoryBatch) -> List[List[TrajectoryBatch]]:
        """Buffer ``batch``; returns the groups that became full (zero or one)."""
        if self._pending and list(batch.fields()) != list(self._pending[0].fields()):
            ready = self.flush()  # field set changed: never mix schemas in one shard
        else:
            ready = []
        self._pending.append(batch)
        self._bytes += batch.nbytes
        if self._bytes >= self.target_bytes or len(self._pending) >= self.max_batches:
            ready += self.flush()
        return ready

    def flush(self) -> List[List[TrajectoryBatch]]:
        """The buffered remainder as a list of at most one group."""
        group, self._pending, self._bytes = self._pending, [], 0
        return [group] if group else []
