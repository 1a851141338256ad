"""R2D2 (Kapturowski et al. 2019): recurrent replay distributed DQN with stored state and burn-in."""
from core.agents.r2d2.actor import LSTMCarry, ladder_epsilon

__all__ = ["LSTMCarry", "ladder_epsilon"]
