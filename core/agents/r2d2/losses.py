r"""R2D2 targets and priorities: value rescaling, n-step double-Q targets on sequences.

**Value rescaling** (Pohlen et al. 2018; R2D2, Kapturowski et al. 2019)::

    h(x)      = sign(x) (sqrt(|x| + 1) - 1) + eps x
    h^{-1}(x) = sign(x) ( ((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1 )

``h`` is strictly increasing and odd, so ``h^{-1}`` is its exact inverse
(solve ``|y| = sqrt(|x|+1) - 1 + eps |x|`` for ``u = sqrt(|x|+1)``:
``eps u^2 + u - (1 + eps + |y|) = 0``). With ``eps = 1e-3``: ``h(0) = 0``,
``h(3) = 1.003``, ``h(-8) = -2.008``, ``h(99) = 9.099``.

**n-step double-Q targets on a sequence** (rows ``t = 0..L-1`` of one
replayed sequence, RLDS layout of :mod:`core.trajectory`: row ``t`` holds
``o_t, a_t, r_t``; an episode's last row holds its final observation and no
action; ``discount_t = 0`` iff row ``t`` is terminated). For a learning row
``t`` (``burn_in <= t``, row real, not an episode's last row) let ``k`` be the
number of steps to the first of: ``n`` steps, the episode's last row, the
sequence's last row ``L-1``. Then::

    R_t  = r_t + g r_{t+1} + ... + g^{k-1} r_{t+k-1}
    D_t  = g^k * discount_{t+k}                  (0 into a terminated row)
    a*   = argmax_a Q_online(o_{t+k}, a)         (double Q)
    y_t  = h( R_t + D_t h^{-1}( Q_target(o_{t+k}, a*) ) )
    delta_t = y_t - Q_online(o_t, a_t)

Q-networks output *rescaled* values; ``h^{-1}`` maps them back to returns.
A truncated episode bootstraps from its final observation (``D_t = g^k``).

**Sequence priority** (R2D2, ``eta = 0.9``) over the learning rows::

    p = eta * max_t |delta_t| + (1 - eta) * mean_t |delta_t|

Example::

    ret, boot, disc, valid = nstep_indices(reward, discount, last, mask, n=5, gamma=0.997, burn_in=20)
    y = double_q_targets(q_online, q_target, ret, boot, disc, eps=1e-3)
"""
from __future__ import annotations

from typing import Tuple

import numpy as np


def value_rescale(x, eps: float = 1e-3):
    """``h(x) = sign(x)(sqrt(|x|+1) - 1) + eps x`` (numpy or TF tensors)."""
    xp = _xp(x)
    return xp.sign(x) * (xp.sqrt(xp.abs(x) + 1.0) - 1.0) + eps * x


def inverse_value_rescale(x, eps: float = 1e-3):
    """``h^{-1}(x) = sign(x)(((sqrt(1 + 4 eps(|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)``, exact inverse of h."""
    xp = _xp(x)
    u = (xp.sqrt(1.0 + 4.0 * eps * (xp.abs(x) + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return xp.sign(x) * (xp.square(u) - 1.0)


def _xp(x):
    if isinstance(x, (np.ndarray, np.generic, float, int)):
        return np
    import tensorflow as tf
    return tf.math


def nstep_indices(reward: np.ndarray, discount: np.ndarray, last: np.ndarray, mask: np.ndarray,
                  n: int, gamma: float, burn_in: int = 0
                  ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Host-side n-step bookkeeping for ``[B, L]`` sequences (see module docstring).

    Returns ``(R [B, L] float32, bootstrap row t+k [B, L] int32, D [B, L]
    float32, valid [B, L] bool)``; entries of rows that are not learning rows
    are 0 (bootstrap index 0) and ``valid`` is False there.
    """
    b, length = reward.shape
    valid = mask & ~last
    valid[:, :burn_in] = False
    ret = np.zeros((b, length), np.float64)
    boot = np.zeros((b, length), np.int32)
    disc = np.zeros((b, length), np.float64)
    for t in range(burn_in, length - 1):
        pos = np.full(b, t)
        active = valid[:, t].copy()
        scale = 1.0
        for _ in range(n):
            ret[:, t] += np.where(active, scale * reward[np.arange(b), pos], 0.0)
            pos = np.where(active, pos + 1, pos)
            scale *= gamma
            active &= ~last[np.arange(b), pos] & (pos < length - 1)
        k = pos - t
        boot[:, t] = np.where(valid[:, t], pos, 0)
        disc[:, t] = np.where(valid[:, t], np.power(gamma, k) * discount[np.arange(b), pos], 0.0)
    valid[:, length - 1] = False        # the last row has no successor in the window
    return ret.astype(np.float32), boot, disc.astype(np.float32), valid


def double_q_targets(q_online, q_target, ret, boot, disc, eps: float = 1e-3):
    """``y = h(R + D h^{-1}(Q_target(o_boot, argmax_a Q_online(o_boot, a))))``, all ``[B, L]`` (TF).

    ``q_online``/``q_target``: ``[B, L, A]`` rescaled Q-values; ``boot``: the
    bootstrap row per learning row (from :func:`nstep_indices`).
    """
    import tensorflow as tf
    q_on_boot = tf.gather(q_online, boot, axis=1, batch_dims=1)       # [B, L, A]
    q_tg_boot = tf.gather(q_target, boot, axis=1, batch_dims=1)
    best = tf.argmax(q_on_boot, axis=-1, output_type=tf.int32)
    bootstrap = tf.gather(q_tg_boot, best, axis=-1, batch_dims=2)
    return value_rescale(ret + disc * inverse_value_rescale(bootstrap, eps), eps)


def sequence_priorities(td_abs: np.ndarray, valid: np.ndarray, eta: float = 0.9) -> np.ndarray:
    """``eta * max_t |delta_t| + (1 - eta) * mean_t |delta_t|`` over each row's valid steps; ``[B]``."""
    td_abs = np.where(valid, np.abs(td_abs), 0.0)
    count = np.maximum(valid.sum(axis=1), 1)
    return (eta * td_abs.max(axis=1) + (1.0 - eta) * td_abs.sum(axis=1) / count).astype(np.float64)
