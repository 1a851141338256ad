"""RL agents, one folder per algorithm."""
