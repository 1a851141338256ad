"""DQN losses: n-step (double) Q-learning targets and the Huber loss.

For a sampled transition ``(s_t, a_t, R_t^{(k)}, d_t, s_{t+k})`` from the
n-step sampler (:mod:`core.replay`), with ``k = min(n, steps to episode end)``

    R_t^{(k)} = r_t + g r_{t+1} + ... + g^{k-1} r_{t+k-1}
    d_t       = g^k, or 0 if s_{t+k} is a terminal observation

the target is ``y_t = R_t^{(k)} + d_t * Q_target(s_{t+k}, a*)`` with

    a* = argmax_a Q_online(s_{t+k}, a)   (double DQN, van Hasselt et al. 2016)
    a* = argmax_a Q_target(s_{t+k}, a)   (classic DQN)

Truncated episodes keep ``d_t = g^k``: the learner bootstraps from the final
observation instead of treating the time limit as a terminal state.
"""
from __future__ import annotations

import tensorflow as tf


def q_learning_targets(q_next_online: tf.Tensor, q_next_target: tf.Tensor, reward: tf.Tensor,
                       discount: tf.Tensor, double_q: bool = True) -> tf.Tensor:
    """``y = reward + discount * Q_target(s', a*)``; see the module docstring. Shapes [B, A], [B]."""
    if double_q:
        best = tf.argmax(q_next_online, axis=-1, output_type=tf.int32)
    else:
        best = tf.argmax(q_next_target, axis=-1, output_type=tf.int32)
    bootstrap = tf.gather(q_next_target, best, axis=-1, batch_dims=1)
    return reward + discount * bootstrap


def huber(x: tf.Tensor, delta: float = 1.0) -> tf.Tensor:
    """Elementwise Huber loss: ``x^2/2`` for ``|x| <= delta``, ``delta (|x| - delta/2)`` beyond."""
    ax = tf.abs(x)
    quadratic = tf.minimum(ax, delta)
    return 0.5 * quadratic ** 2 + delta * (ax - quadratic)
