"""How far a DQN learner step is from this core's matmul speed: the ceiling on any learner speed-up.

A learner step of the default network is almost all matrix multiplies: double DQN runs the online
network on the batch and on the next observations, the target network on the next observations, and
the backward pass through the online network (a weight gradient per layer, an input gradient for all
but the first). Its matmul work is therefore fixed by the network and the batch::

    F     = sum over dense layers of  in x out               (multiply-adds per row of one forward pass)
    FLOPs = 2 x B x (3 F  +  F  +  (F - in_0 x out_0))       (3 forwards, weight grads, input grads)

:func:`matmul_gflops` times a chain of ``[B, h] x [h, h]`` matmuls (the network's widest hidden
layer, where the work is) in TensorFlow at one precision, on the threads the process was given.
``FLOPs / rate`` is then the fastest a step could be if everything else it does (dispatch, the
loss, Adam, the host->TF copy) cost nothing: no code path can beat that ceiling at that precision.

Example::

    flops = dqn_step_flops(obs_dim=4, hidden=(256, 256), num_actions=2, batch=64)   # 42,795,008
    rate = matmul_gflops(batch=64, width=256)                                        # e.g. 89.0 GFLOP/s
    ceiling_ms = flops / (rate * 1e9) * 1e3
"""
from __future__ import annotations

import time
from typing import Sequence


def dqn_step_flops(obs_dim: int, hidden: Sequence[int], num_actions: int, batch: int) -> int:
    """Matmul FLOPs of one double-DQN learner step (module docstring); elementwise work not counted."""
    widths = [int(obs_dim), *[int(h) for h in hidden], int(num_actions)]
    per_row = sum(a * b for a, b in zip(widths[:-1], widths[1:]))
    first = widths[0] * widths[1]
    return 2 * int(batch) * (3 * per_row + per_row + (per_row - first))


def matmul_gflops(batch: int, width: int, dtype: str = "float32", chain: int = 64, seconds: float = 1.0) -> float:
    """GFLOP/s of ``[batch, width] x [width, width]`` matmuls in TensorFlow, best of repeated calls.

    Each call runs ``chain`` matmuls, each on the previous one's output (scaled to stay finite), in one
    ``tf.function``, so graph optimisation cannot merge them and dispatch is paid once per chain.
    """
    import tensorflow as tf
    dt = tf.as_dtype(dtype)
    x0 = tf.cast(tf.random.stateless_normal((batch, width), seed=(1, 2)), dt)
    w = tf.cast(tf.random.stateless_normal((width, width), seed=(3, 4)) / (width ** 0.5), dt)

    @tf.function
    def run(x):
        for _ in range(chain):
            x = tf.matmul(x, w)
        return x

    run(x0).numpy()
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end or best == float("inf"):
        t0 = time.perf_counter()
        run(x0).numpy()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * batch * width * width * chain / best / 1e9
