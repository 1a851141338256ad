"""D4PG hyperparameters (the ``agent:`` section when ``algo: d4pg``).

Defaults follow Acme's D4PG (``acme/agents/tf/d4pg``) scaled to small
control tasks: 51 atoms, n = 5, Adam 1e-4 / 1e-4 there; here 3e-4 for a
2-core budget, with soft target updates (tau = 0.005).
"""
from __future__ import annotations

import dataclasses
import math
from typing import List, Literal


@dataclasses.dataclass
class D4PGConfig:
    algo: Literal["d4pg"] = "d4pg"
    policy_hidden: List[int] = dataclasses.field(default_factory=lambda: [256, 256])
    critic_hidden: List[int] = dataclasses.field(default_factory=lambda: [256, 256])
    num_atoms: int = 51
    v_min: float = -150.0              # support of the return distribution [v_min, v_max]
    v_max: float = 150.0
    gamma: float = 0.99
    n_step: int = 5
    policy_learning_rate: float = 3e-4
    critic_learning_rate: float = 3e-4
    batch_size: int = 256
    target_update: Literal["soft", "periodic"] = "soft"
    tau: float = 0.005                 # soft: target <- tau * online + (1 - tau) * target, every step
    target_update_period: int = 100    # periodic: hard copy every this many learner steps
    max_grad_norm: float = 40.0
    sigma: float = 0.3                 # Gaussian exploration noise, in units of the half action range
    sigma_min: float = 0.05            # lowest rung of the per-actor noise ladder
    noise_ladder: int = 0              # 0 = every actor uses sigma; k > 0 = Ape-X-style ladder of k rungs
    prioritized: bool = False          # accepted for sampler symmetry with DQN; uniform is the D4PG default
    # XLA-compile the K-step loop (critic, policy, targets); its first call takes ~1.7 s more. On Zen 4 the
    # learner-bound configs (pendulum-d4pg.yaml, dmc-cartpole-balance-d4pg.yaml) reach their targets in
    # 0.84x / 0.89x the time over 5 seeds (benchmarks/RESULTS.md), so they turn it on.
    jit_compile: bool = False

    def __post_init__(self):
        if not self.v_min < self.v_max:
            from core.config import ConfigError
            raise ConfigError(f"config keys 'agent.v_min' = {self.v_min!r} and 'agent.v_max' = {self.v_max!r} "
                              f"are out of range; valid: v_min < v_max")


#: key -> (predicate, valid range), checked by core.config.validate
RANGES = {
    "gamma": (lambda v: 0.0 <= v <= 1.0, "0..1"),
    "n_step": (lambda v: 1 <= v <= 100, "1..100"),
    "num_atoms": (lambda v: v >= 2, ">= 2"),
    "v_min": (lambda v: math.isfinite(v), "a finite number (and v_min < v_max)"),
    "v_max": (lambda v: math.isfinite(v), "a finite number (and v_min < v_max)"),
    "policy_learning_rate": (lambda v: 0.0 < v < 1.0, "0 < lr < 1"),
    "critic_learning_rate": (lambda v: 0.0 < v < 1.0, "0 < lr < 1"),
    "batch_size": (lambda v: v >= 1, ">= 1"),
    "tau": (lambda v: 0.0 < v <= 1.0, "0 < tau <= 1"),
    "target_update_period": (lambda v: v >= 1, ">= 1"),
    "max_grad_norm": (lambda v: v > 0, "> 0"),
    "sigma": (lambda v: v >= 0.0, ">= 0"),
    "sigma_min": (lambda v: v >= 0.0, ">= 0"),
    "noise_ladder": (lambda v: v >= 0, ">= 0 (0 = off)"),
    "policy_hidden": (lambda v: len(v) >= 1 and all(h >= 1 for h in v), "non-empty list of widths >= 1"),
    "critic_hidden": (lambda v: len(v) >= 1 and all(h >= 1 for h in v), "non-empty list of widths >= 1"),
}
