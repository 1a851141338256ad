"""Behaviour-cloning hyperparameters (the ``agent:`` section when ``algo: bc``)."""
from __future__ import annotations

import dataclasses
from typing import List, Literal


@dataclasses.dataclass
class BCConfig:
    algo: Literal["bc"] = "bc"
    hidden: List[int] = dataclasses.field(default_factory=lambda: [256, 256])
    learning_rate: float = 1e-3
    batch_size: int = 256
    max_grad_norm: float = 10.0
    gamma: float = 0.99                # unused by the loss; kept so n-step samplers can be shared
    n_step: int = 1


#: key -> (predicate, valid range), checked by core.config.validate
RANGES = {
    "learning_rate": (lambda v: 0.0 < v < 1.0, "0 < lr < 1"),
    "batch_size": (lambda v: v >= 1, ">= 1"),
    "hidden": (lambda v: len(v) >= 1 and all(h >= 1 for h in v), "non-empty list of widths >= 1"),
    "n_step": (lambda v: v >= 1, ">= 1"),
    "gamma": (lambda v: 0.0 <= v <= 1.0, "0..1"),
    "max_grad_norm": (lambda v: v > 0.0, "> 0"),   # Adam's global_clipnorm: 0 would zero every gradient
}
