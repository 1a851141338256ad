"""DQN (double, n-step, target network) with epsilon-greedy int8 actors."""
from core.agents.dqn.actor import LinearEpsilon

__all__ = ["LinearEpsilon"]
