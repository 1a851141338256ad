"""V-trace hyperparameters (the ``agent:`` section when ``algo: vtrace``).

Replay ratio note: one learner step consumes ``batch_size`` unrolls of
``unroll_length`` transitions, so ``learner.replay_ratio`` (learner steps per
env step) is about ``reuse / (batch_size * unroll_length)``; e.g. 32 x 20
unrolls replayed about twice each -> ``replay_ratio: 0.003``. Keep
``replay.capacity`` small (a few policy versions of data) so replay stays
near on-policy; V-trace corrects the remaining staleness and quantization.
"""
from __future__ import annotations

import dataclasses
from typing import List, Literal


@dataclasses.dataclass
class VTraceConfig:
    algo: Literal["vtrace"] = "vtrace"
    torso: Literal["mlp", "nature_cnn"] = "mlp"   # nature_cnn for pixels (core.agents.vtrace.networks)
    hidden: List[int] = dataclasses.field(default_factory=lambda: [64, 64])
    frame_stack: int = 1               # pixels: frames stacked at sampling time (single frames are stored)
    gamma: float = 0.99
    unroll_length: int = 20            # T transitions per unroll (sequences of T + 1 rows)
    td_lambda: float = 1.0             # lambda in c_t = lambda * min(c_bar, pi/mu)
    rho_bar: float = 1.0               # truncation of the importance weight in the value target
    c_bar: float = 1.0                 # truncation of the trace coefficients
    pg_rho_bar: float = 1.0            # truncation of the importance weight in the policy gradient
    learning_rate: float = 1e-3
    learning_rate_decay_steps: int = 0  # > 0: linear decay to learning_rate_end over these learner steps
    learning_rate_end: float = 0.0      # (IMPALA, SEED RL and torchbeast anneal linearly to 0)
    batch_size: int = 32               # unrolls per learner step
    entropy_cost: float = 0.01
    baseline_cost: float = 0.5
    max_grad_norm: float = 40.0


#: key -> (predicate, valid range), checked by core.config.validate
RANGES = {
    "hidden": (lambda v: len(v) >= 1 and all(h >= 1 for h in v), "non-empty list of widths >= 1"),
    "frame_stack": (lambda v: 1 <= v <= 16, "1..16"),
    "gamma": (lambda v: 0.0 <= v <= 1.0, "0..1"),
    "unroll_length": (lambda v: 1 <= v <= 1000, "1..1000"),
    "td_lambda": (lambda v: 0.0 <= v <= 1.0, "0..1"),
    "rho_bar": (lambda v: v > 0.0, "> 0"),
    "c_bar": (lambda v: v > 0.0, "> 0"),
    "pg_rho_bar": (lambda v: v > 0.0, "> 0"),
    "learning_rate": (lambda v: 0.0 < v < 1.0, "0 < lr < 1"),
    "learning_rate_decay_steps": (lambda v: v >= 0, ">= 0 (0: constant learning rate)"),
    "learning_rate_end": (lambda v: 0.0 <= v < 1.0, "0 <= lr < 1"),
    "batch_size": (lambda v: v >= 1, ">= 1"),
    "entropy_cost": (lambda v: v >= 0.0, ">= 0"),
    "baseline_cost": (lambda v: v >= 0.0, ">= 0"),
    "max_grad_norm": (lambda v: v > 0.0, "> 0"),
}
