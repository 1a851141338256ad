"""Samplers: uniform and prioritized n-step transitions, and fixed-length sequences.

All samplers read a ``ReplayCache`` and use its successor pointers
(``cache.next``); sampleable rows are recomputed only when the cache changes
(``cache.generation``), so ``sample`` is a handful of vectorized gathers.

**n-step return** (Acme's ``NStepTransitionAdder`` convention). For a row
``i`` that is not the last row of its episode, let ``d`` be the number of
steps to the episode's last row and ``k = min(n, d)``::

    reward   R_i = r_i + g r_{i+1} + ... + g^{k-1} r_{i+k-1}
    discount D_i = g^k * (0 if row i+k is terminated else 1)
    next_observation = o_{i+k}

so learners form ``R_i + D_i * max_a Q(o_{i+k}, a)``. A terminated episode
is never bootstrapped across (``D = 0``); a truncated one is bootstrapped
from its final observation (``D = g^k``). Row ``i`` is sampleable only if
it is not a last row and rows ``i+1 .. i+k`` are all in the cache (an episode
whose continuation is not committed yet waits for it).

**Prioritized** (Schaul et al. 2016): ``P(i) = p_i^a / sum_j p_j^a`` through
a sum-tree, stratified over the batch; importance weights
``w_i = (N P(i))^-b / max_batch w`` with ``N`` the number of sampleable rows.
New rows get the largest priority seen so far.

**Sequences** (R2D2 burn-in, V-trace unrolls): ``L`` consecutive rows of one
episode from a random start; after the episode's last row the sequence is
padded by repeating that row with ``mask = False``. Starts are rows that are
not last, whose window (up to ``L - 1`` successors or the episode end) is in
the cache and that leave at least one transition after the ``burn_in`` rows.

Example::

    sampler = NStepSampler(cache, n=3, gamma=0.99)
    batch = sampler.sample(256, np.random.default_rng(0))
    target = batch["reward"] + batch["discount"] * q_next(batch["next_observation"])
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from core.replay.schema import ReplayError
from core.replay.sumtree import SumTree

#: Fields that are bookkeeping, not returned as per-row data by n-step samplers.
_NSTEP_SKIP = ("reward", "discount", "terminated", "truncated", "episode_id", "step")


def nstep_ready(nxt: np.ndarray, last: np.ndarray, alive: np.ndarray, n: int) -> np.ndarray:
    """Rows that are not last and whose ``min(n, d)`` successors are all present."""
    ready = alive & ~last & (nxt >= 0)
    pos = np.where(ready, nxt, 0)
    active = ready & ~last[pos]
    for _ in range(n - 1):
        nx = nxt[pos]
        present = nx >= 0
        ready &= ~active | present
        active &= present
        pos = np.where(active, nx, pos)
        active &= ~last[pos]
    return ready


class NStepSampler:
    """Uniform n-step transitions from a ReplayCache (see module docstring for the math)."""

    def __init__(self, cache, n: int = 3, gamma: float = 0.99):
        if n < 1 or not 0.0 <= gamma <= 1.0:
            raise ReplayError(f"n={n}, gamma={gamma} invalid; valid: n >= 1, 0 <= gamma <= 1")
        self.cache, self.n, self.gamma = cache, int(n), float(gamma)
        self._generation = -1
        self.ready = np.zeros(0, bool)
        self.ready_slots = np.zeros(0, np.int64)

    @property
    def num_sampleable(self) -> int:
        self._sync()
        return len(self.ready_slots)

    def _sync(self) -> bool:
        """Recompute sampleable rows if the cache changed; True if it did."""
        if self._generation == self.cache.generation:
            return False
        c = self.cache
        if c.capacity:
            self.ready = nstep_ready(c.next, c.last, c.alive, self.n)
            self.ready_slots = np.flatnonzero(self.ready)
        self._generation = c.generation
        return True

    def _check(self) -> None:
        if not len(self.ready_slots):
            raise ReplayError(f"no sampleable transitions in the replay cache ({self.cache.size} rows);"
                              " commit shards and call cache.refresh() first")

    def sample(self, batch_size: int, rng: np.random.Generator) -> Dict[str, np.ndarray]:
        """``batch_size`` transitions drawn uniformly (with replacement) from sampleable rows."""
        self._sync()
        self._check()
        slots = self.ready_slots[rng.integers(len(self.ready_slots), size=batch_size)]
        out = self.transitions(slots)
        out["weight"] = np.ones(batch_size, np.float32)
        return out

    def transitions(self, slots: np.ndarray) -> Dict[str, np.ndarray]:
        """n-step transitions starting at cache ``slots`` (all must be sampleable)."""
        c, g = self.cache, self.gamma
        reward, nxt, last = c.data["reward"], c.next, c.last
        pos, active = slots, np.ones(len(slots), bool)
        ret, k, scale = np.zeros(len(slots), np.float64), np.zeros(len(slots), np.int32), 1.0
        for _ in range(self.n):
            ret += np.where(active, scale * reward[pos], 0.0)
            k += active
            pos = np.where(active, nxt[pos], pos)
            active &= ~last[pos]
            scale *= g
        out = {name: arr[slots] for name, arr in c.data.items() if name not in _NSTEP_SKIP}
        out["next_observation"] = c.data["observation"][pos]
        out["reward"] = ret.astype(np.float32)
        out["discount"] = np.where(c.data["terminated"][pos], 0.0, np.power(g, k)).astype(np.float32)
        out["nstep"] = k
        out["index"] = c.row_id[slots]
        return out


class PriorityState:
    """A prioritized sampler's priorities as arrays, so ``--resume`` samples what the run would have.

    A mixin of the prioritized samplers (this module's, and R2D2's sequence
    sampler). What changes their sampling, besides the cache and the RNG
    (a stream of its own per learner block, :mod:`pipelines.run.plan`), is
    ``_prio`` (``p ** alpha`` per cache slot: the sum-tree's leaves are it,
    masked to the sampleable rows), ``_owner`` (the row id each priority
    belongs to: a slot whose row changed gets ``max_priority ** alpha`` at
    the next sync) and ``max_priority``. The tree itself is not state: it is
    rebuilt from them at the next sync, and its sums are the same pairwise
    sums ``update`` computes, so the leaves fix every node bit for bit.

    Example::

        state = sampler.priority_state()      # {"row_id", "priority", "max_priority", "alpha"}
        # ... rebuild the same cache (pipelines.run.resume.replay_cache) and a fresh sampler over it ...
        fresh.restore_priorities(state)       # fresh.sample(b, rng) == sampler.sample(b, rng)
    """

    tree: Optional[SumTree]

    def _allocate_priorities(self) -> None:
        """The tree and per-slot arrays, once the cache has its capacity (fixed from then on)."""
        if self.tree is None:
            c = self.cache
            self.tree = SumTree(c.capacity)
            self._owner = np.full(c.capacity, -1, np.int64)   # row id each stored priority belongs to
            self._prio = np.zeros(c.capacity, np.float64)     # p^alpha per slot

    def priority_state(self) -> Dict[str, Any]:
        """Copies of the priorities held (slots that never held a row are left out: 16 bytes a row)."""
        if self.tree is None:
            rows, prio = np.zeros(0, np.int64), np.zeros(0, np.float64)
        else:
            held = self._owner >= 0
            rows, prio = self._owner[held], self._prio[held]     # boolean indexing: fresh copies
        return {"row_id": rows, "priority": prio, "max_priority": float(self.max_priority),
                "alpha": float(self.alpha)}

    def restore_priorities(self, state: Dict[str, Any]) -> None:
        """Take over ``priority_state()``'s priorities; call it once the cache is rebuilt.

        A priority is kept where its row is still in its slot (``row_id %
        capacity``); the others (a cache rebuilt smaller, or differently)
        count as new rows and get ``max_priority`` at the next sync, as
        their slots would have anyway. A changed ``alpha`` re-exponentiates.
        """
        self.max_priority = float(state["max_priority"])
        # Both samplers' sync markers: the next sample recomputes sampleable rows and rebuilds the tree.
        self._generation = self._tree_generation = -1
        c = self.cache
        if not c.capacity:
            return
        self._allocate_priorities()
        rows = np.asarray(state["row_id"], np.int64)
        prio = np.asarray(state["priority"], np.float64)
        if float(state["alpha"]) != self.alpha:
            prio = np.power(prio, self.alpha / float(state["alpha"]))
        slots = c.slots(rows)
        here = c.row_id[slots] == rows
        self._owner[:], self._prio[:] = -1, 0.0
        self._owner[slots[here]], self._prio[slots[here]] = rows[here], prio[here]


class PrioritizedNStepSampler(PriorityState, NStepSampler):
    """n-step transitions sampled in proportion to ``priority ** alpha`` (sum-tree).

    Example::

        sampler = PrioritizedNStepSampler(cache, n=3, gamma=0.99, alpha=0.6, beta=0.4)
        batch = sampler.sample(256, rng)
        sampler.update_priorities(batch["index"], np.abs(td_error))
    """

    def __init__(self, cache, n: int = 3, gamma: float = 0.99, alpha: float = 0.6, beta: float = 0.4,
                 eps: float = 1e-6):
        super().__init__(cache, n, gamma)
        self.alpha, self.beta, self.eps = float(alpha), float(beta), float(eps)
        self.max_priority = 1.0
        self.tree: Optional[SumTree] = None

    def _sync(self) -> bool:
        if not super()._sync():
            return False
        c = self.cache
        if not c.capacity:
            return True
        self._allocate_priorities()
        fresh = self._owner != c.row_id
        self._prio[fresh] = self.max_priority ** self.alpha
        self._owner[fresh] = c.row_id[fresh]
        self.tree.rebuild(np.where(self.ready, self._prio, 0.0))
        return True

    def sample(self, batch_size: int, rng: np.random.Generator) -> Dict[str, np.ndarray]:
        self._sync()
        self._check()
        total = self.tree.total
        u = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)  # stratified
        slots = self.tree.find(u)
        out = self.transitions(slots)
        prob = self.tree.leaves()[slots] / total
        w = np.power(len(self.ready_slots) * prob, -self.beta)
        out["weight"] = (w / w.max()).astype(np.float32)
        out["probability"] = prob.astype(np.float32)
        return out

    def update_priorities(self, index: np.ndarray, priorities: np.ndarray) -> None:
        """Set priorities of rows ``index`` (row ids from ``sample``); stale ids are ignored."""
        self._sync()
        index = np.asarray(index, np.int64)
        priorities = np.abs(np.asarray(priorities, np.float64)) + self.eps
        keep = self.cache.is_current(index)
        if not keep.any():
            return
        slots, p = self.cache.slots(index[keep]), priorities[keep]
        self.max_priority = max(self.max_priority, float(p.max()))
        self._prio[slots] = p ** self.alpha
        self.tree.update(slots, np.where(self.ready[slots], self._prio[slots], 0.0))


class SequenceSampler:
    """Fixed-length sequences ``[B, L, ...]`` with a validity mask (R2D2, V-trace).

    Returns every cached field as ``[B, L, ...]`` plus ``mask`` [B, L] (row is
    part of the episode; False on padding after its last row), ``index``
    [B, L] row ids and ``weight`` [B] (ones). The first ``burn_in`` steps are
    for warming up recurrent state; recurrent state stored as an extra (e.g.
    ``extras/core_state``) is read at ``[:, 0]``.
    """

    def __init__(self, cache, length: int = 80, burn_in: int = 40):
        if not 0 <= burn_in < length:
            raise ReplayError(f"length={length}, burn_in={burn_in} invalid; valid: 0 <= burn_in < length")
        self.cache, self.length, self.burn_in = cache, int(length), int(burn_in)
        self._generation = -1
        self.start_slots = np.zeros(0, np.int64)

    def _sync(self) -> None:
        c = self.cache
        if self._generation == c.generation or not c.capacity:
            return
        nxt, last = c.next, c.last
        ok = c.alive & ~last & (nxt >= 0)
        pos = np.where(ok, nxt, 0)
        steps = ok.astype(np.int64)
        active = ok & ~last[pos]
        for _ in range(self.length - 2):
            nx = nxt[pos]
            present = nx >= 0
            ok &= ~active | present
            active &= present
            pos = np.where(active, nx, pos)
            steps += active
            active &= ~last[pos]
        self.start_slots = np.flatnonzero(ok & (steps > self.burn_in))
        self._generation = c.generation

    @property
    def num_sampleable(self) -> int:
        self._sync()
        return len(self.start_slots)

    def sample(self, batch_size: int, rng: np.random.Generator) -> Dict[str, np.ndarray]:
        self._sync()
        if not len(self.start_slots):
            raise ReplayError(f"no sequence of length {self.length} (burn-in {self.burn_in}) is available in"
                              f" the replay cache ({self.cache.size} rows); commit more data and refresh()")
        c = self.cache
        slots = self.start_slots[rng.integers(len(self.start_slots), size=batch_size)]
        pos = np.empty((batch_size, self.length), np.int64)
        mask = np.zeros((batch_size, self.length), bool)
        cur, active = slots, np.ones(batch_size, bool)
        for t in range(self.length):
            pos[:, t], mask[:, t] = cur, active
            active = active & ~c.last[cur]
            cur = np.where(active, c.next[cur], cur)
        out = {name: arr[pos] for name, arr in c.data.items()}
        out.update(mask=mask, index=c.row_id[pos], weight=np.ones(batch_size, np.float32))
        return out
