"""DQN acting: the epsilon-greedy exploration schedule.

The greedy part runs inside the actor's LiteRT policy (see core.rollout);
this module only decides epsilon, as a function of global env steps:

    eps(t) = end + (start - end) * max(0, 1 - t / decay_steps)
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LinearEpsilon:
    """Linear decay from ``start`` to ``end`` over ``decay_steps`` env steps, then flat."""
    start: float
    end: float
    decay_steps: int

    def __call__(self, env_steps: int) -> float:
        frac = max(0.0, 1.0 - env_steps / self.decay_steps)
        return float(self.end + (self.start - self.end) * frac)
