"""DQN hyperparameters (the ``agent:`` section when ``algo: dqn``)."""
from __future__ import annotations

import dataclasses
from typing import List, Literal


@dataclasses.dataclass
class EpsilonConfig:
    """Linear epsilon-greedy schedule over env steps: start -> end over decay_steps."""
    start: float = 1.0
    end: float = 0.04
    decay_steps: int = 8_000


@dataclasses.dataclass
class DQNConfig:
    algo: Literal["dqn"] = "dqn"
    hidden: List[int] = dataclasses.field(default_factory=lambda: [256, 256])
    gamma: float = 0.99
    n_step: int = 3
    double_q: bool = True
    learning_rate: float = 1e-3
    batch_size: int = 64
    target_update_period: int = 100    # learner steps between hard target updates
    huber_delta: float = 1.0
    max_grad_norm: float = 10.0
    prioritized: bool = False          # prioritized replay (sum-tree) instead of uniform
    # How the learner's K-step loop runs (same maths; benchmarks/micro/learner_speed.py measures each):
    fused_adam: bool = True            # Adam as one ResourceApplyAdam per variable (core.agents.fused_adam)
    # XLA-compile the K-step loop. Off: on Zen 4 (2026-12-05, learner_speed.py, 2 paired runs) fused+xla ran
    # 0.98-1.03x fused on [256, 256] and 0.75-0.85x on 3x2048, and its first call costs 1.1-1.5 s more.
    jit_compile: bool = False
    epsilon: EpsilonConfig = dataclasses.field(default_factory=EpsilonConfig)


#: key -> (predicate, valid range), checked by core.config.validate
RANGES = {
    "gamma": (lambda v: 0.0 <= v <= 1.0, "0..1"),
    "n_step": (lambda v: 1 <= v <= 100, "1..100"),
    "learning_rate": (lambda v: 0.0 < v < 1.0, "0 < lr < 1"),
    "batch_size": (lambda v: v >= 1, ">= 1"),
    "target_update_period": (lambda v: v >= 1, ">= 1"),
    "huber_delta": (lambda v: v > 0.0, "> 0"),     # 0 makes the loss (and every gradient) zero
    "max_grad_norm": (lambda v: v > 0.0, "> 0"),   # Adam's global_clipnorm: 0 would zero every gradient
    "hidden": (lambda v: len(v) >= 1 and all(h >= 1 for h in v), "non-empty list of widths >= 1"),
    "epsilon.start": (lambda v: 0.0 <= v <= 1.0, "0..1"),
    "epsilon.end": (lambda v: 0.0 <= v <= 1.0, "0..1"),
    "epsilon.decay_steps": (lambda v: v >= 1, ">= 1"),
}
