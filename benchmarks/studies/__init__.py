"""Whole-run studies: the ActorQ study with its cost model, projection, validation and ratio sweep; the
learning suite; time to solve against Stable-Baselines3; learning curves of long runs."""
