"""D4PG (Barth-Maron et al. 2018): deterministic tanh actor, categorical critic, n-step, int8 actors."""
from core.agents.d4pg.actor import noise_sigma

__all__ = ["noise_sigma"]
