r"""Prioritized sequence replay (R2D2): sequences drawn in proportion to ``p^alpha``.

Built on :class:`core.replay.SequenceSampler` (which start rows form a
sequence of ``length`` rows with at least one learning row after
``burn_in``) and :class:`core.replay.SumTree` (one leaf per cache slot; only
valid start rows have non-zero mass)::

    P(i) = p_i^alpha / sum_j p_j^alpha
    w_i  = (N P(i))^-beta / max_batch w          (importance-sampling weights)

``N`` is the number of valid start rows. Sequence priorities come from the
learner (:func:`core.agents.r2d2.losses.sequence_priorities`,
``eta max|delta| + (1-eta) mean|delta|``); new rows get the largest priority
seen so far, so fresh data is replayed soon. A priority belongs to the
sequence's *start row* (``index[:, 0]``); stale row ids (evicted from the
cache) are ignored. ``priority_state`` / ``restore_priorities``
(:class:`core.replay.samplers.PriorityState`) carry the priorities through
a checkpoint.

Example::

    sampler = PrioritizedSequenceSampler(cache, length=40, burn_in=10, alpha=0.9, beta=0.6)
    batch = sampler.sample(32, rng)                  # [32, 40, ...], mask, index, weight
    sampler.update_priorities(batch["index"], learner.step(batch)["td_abs"])
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from core.replay import ReplayError, SequenceSampler, SumTree
from core.replay.samplers import PriorityState


class PrioritizedSequenceSampler(PriorityState, SequenceSampler):
    """Sequences ``[B, L, ...]`` sampled by priority, with IS weights (see module docstring)."""

    def __init__(self, cache, length: int = 40, burn_in: int = 10, alpha: float = 0.9, beta: float = 0.6,
                 eps: float = 1e-6):
        super().__init__(cache, length, burn_in)
        self.alpha, self.beta, self.eps = float(alpha), float(beta), float(eps)
        self.max_priority = 1.0
        self.tree: Optional[SumTree] = None
        self._tree_generation = -1

    def _sync(self) -> None:
        super()._sync()
        c = self.cache
        if self._tree_generation == c.generation or not c.capacity:
            return
        self._allocate_priorities()
        fresh = self._owner != c.row_id
        self._prio[fresh] = self.max_priority ** self.alpha
        self._owner[fresh] = c.row_id[fresh]
        self.is_start = np.zeros(c.capacity, bool)
        self.is_start[self.start_slots] = True
        self.tree.rebuild(np.where(self.is_start, self._prio, 0.0))
        self._tree_generation = c.generation

    def sample(self, batch_size: int, rng: np.random.Generator) -> Dict[str, np.ndarray]:
        self._sync()
        if not len(self.start_slots):
            raise ReplayError(f"no sequence of length {self.length} (burn-in {self.burn_in}) is available in"
                              f" the replay cache ({self.cache.size} rows); commit more data and refresh()")
        total = self.tree.total
        u = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)   # stratified
        slots = self.tree.find(u)
        out = self.gather(slots)
        prob = self.tree.leaves()[slots] / total
        w = np.power(len(self.start_slots) * prob, -self.beta)
        out["weight"] = (w / w.max()).astype(np.float32)
        out["probability"] = prob.astype(np.float32)
        return out

    def gather(self, slots: np.ndarray) -> Dict[str, np.ndarray]:
        """The sequences starting at cache ``slots`` (as SequenceSampler lays them out)."""
        c, b = self.cache, len(slots)
        pos = np.empty((b, self.length), np.int64)
        mask = np.zeros((b, self.length), bool)
        cur, active = slots, np.ones(b, bool)
        for t in range(self.length):
            pos[:, t], mask[:, t] = cur, active
            active = active & ~c.last[cur]
            cur = np.where(active, c.next[cur], cur)
        out = {name: arr[pos] for name, arr in c.data.items()}
        out.update(mask=mask, index=c.row_id[pos], weight=np.ones(b, np.float32))
        return out

    def update_priorities(self, index: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of the sequences starting at ``index[:, 0]`` (or ``index`` if 1-D)."""
        self._sync()
        index = np.asarray(index, np.int64)
        if index.ndim == 2:
            index = index[:, 0]
        p = np.abs(np.asarray(priorities, np.float64)).reshape(-1) + self.eps
        keep = self.cache.is_current(index)
        if not keep.any():
            return
        slots, p = self.cache.slots(index[keep]), p[keep]
        self.max_priority = max(self.max_priority, float(p.max()))
        self._prio[slots] = p ** self.alpha
        self.tree.update(slots, np.where(self.is_start[slots], self._prio[slots], 0.0))
