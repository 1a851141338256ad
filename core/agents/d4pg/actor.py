"""D4PG acting: Gaussian exploration noise, optionally an Ape-X-style per-actor ladder.

The deterministic action ``pi(s)`` runs inside the actor's LiteRT policy;
the ``tanh_gaussian`` selector (core.exploration) adds the noise. This module
only decides ``sigma`` for one rollout task. With a ladder of ``k`` rungs,
actor ``i`` explores with (geometric spacing, as Ape-X spaces epsilons)

    sigma_i = sigma * (sigma_min / sigma) ** (j / (k - 1)),   j = i mod k

so rung 0 explores most (``sigma``) and rung ``k-1`` least (``sigma_min``);
``k = 1`` or ``k = 0`` gives every actor ``sigma``.
"""
from __future__ import annotations


def noise_sigma(sigma: float, sigma_min: float, ladder: int, actor_id: int) -> float:
    """Exploration std of actor ``actor_id`` (see module docstring)."""
    if ladder <= 1 or sigma <= 0.0:
        return float(sigma)
    j = actor_id % ladder
    lo = max(sigma_min, 1e-8)
    return float(sigma * (lo / sigma) ** (j / (ladder - 1)))
