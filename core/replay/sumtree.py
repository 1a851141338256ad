"""SumTree: vectorized proportional sampling over fixed slots (prioritized replay).

A complete binary tree in one array: leaves ``tree[P:P+capacity]`` hold the
slot priorities ``p_i`` (``P`` = capacity rounded up to a power of two) and
every inner node holds the sum of its children, so ``tree[1]`` is the total.
Sampling descends from the root for all queries at once (``log2 P`` numpy
steps for the whole batch); updates recompute only the ancestors of the
changed leaves, level by level.

Example::

    tree = SumTree(4)
    tree.update(np.arange(4), np.array([1., 2., 3., 4.]))
    tree.find(np.array([0.5, 2.5, 9.9]))   # -> [0, 1, 3]
"""
from __future__ import annotations

import numpy as np


class SumTree:
    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.leaf0 = 1 << max(0, (self.capacity - 1).bit_length())
        self.tree = np.zeros(2 * self.leaf0, np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def leaves(self) -> np.ndarray:
        return self.tree[self.leaf0:self.leaf0 + self.capacity]

    def rebuild(self, priorities: np.ndarray) -> None:
        """Set all leaves at once and recompute every inner node (O(capacity))."""
        self.tree[:] = 0.0
        self.tree[self.leaf0:self.leaf0 + self.capacity] = priorities
        i = self.leaf0
        while i > 1:
            self.tree[i // 2:i] = self.tree[i:2 * i:2] + self.tree[i + 1:2 * i:2]
            i //= 2

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set the leaves of ``slots`` (the last duplicate wins) and fix their ancestors."""
        idx = np.asarray(slots, np.int64) + self.leaf0
        self.tree[idx] = priorities
        # Duplicate parents get the same value from the same children: no need to dedupe.
        for _ in range(self.leaf0.bit_length() - 1):
            idx //= 2
            self.tree[idx] = self.tree[2 * idx] + self.tree[2 * idx + 1]

    def find(self, values: np.ndarray) -> np.ndarray:
        """Slots ``i`` with ``sum(p[:i]) <= value < sum(p[:i+1])`` (values in [0, total))."""
        u = np.minimum(np.asarray(values, np.float64), np.nextafter(self.tree[1], 0.0))
        idx = np.ones(u.shape, np.int64)
        for _ in range(self.leaf0.bit_length() - 1):
            left = self.tree[2 * idx]
            right = (u >= left) & (self.tree[2 * idx + 1] > 0)
            u = np.where(right, u - left, u)
            idx = 2 * idx + right
        return idx - self.leaf0
