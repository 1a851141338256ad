"""Behaviour cloning: the offline baseline (imitate the dataset's actions)."""
