"""D4PG losses: the categorical projection, the distributional critic loss and the DPG loss.

Notation: support ``z_0 < ... < z_{N-1}`` with ``z_i = v_min + i dz``,
``dz = (v_max - v_min) / (N - 1)``. The n-step sampler gives, per transition,

    R = r_t + g r_{t+1} + ... + g^{k-1} r_{t+k-1}      (k = min(n, steps to the end))
    D = g^k, or 0 if s_{t+k} is terminal                (truncation keeps g^k)

and the target critic gives probabilities ``p_j`` over atoms ``z_j`` at
``(s_{t+k}, pi_target(s_{t+k}))``.

**Projection** (Bellemare et al. 2017, C51; D4PG uses the same). The target
distribution puts mass ``p_j`` on ``Tz_j = R + D z_j``, which lies off the
support, so it is projected onto it. Each shifted atom is clipped into the
support and its mass split between the two nearest atoms in proportion to
closeness:

    Tz_j  = clip(R + D z_j, v_min, v_max)
    m_i   = sum_j p_j * max(0, 1 - |Tz_j - z_i| / dz)

(equivalently ``b_j = (Tz_j - v_min) / dz``, ``l = floor(b_j)``,
``u = ceil(b_j)``: ``m_l += p_j (u - b_j)``, ``m_u += p_j (b_j - l)``, and all of
``p_j`` goes to ``l`` when ``b_j`` is an integer). ``sum_i m_i = sum_j p_j``.
With ``D = 0`` (terminal) every atom collapses onto ``clip(R)``; returns
beyond the support pile up on ``z_0`` or ``z_{N-1}``.

**Critic loss**: cross-entropy ``-sum_i m_i log softmax(logits(s_t, a_t))_i``,
with ``m`` held constant (a stop-gradient target).

**Policy loss** (deterministic policy gradient on the distributional critic):
``-mean_B sum_i softmax(logits(s_t, pi(s_t)))_i z_i``, i.e. ascend
``Q(s, pi(s))``; only the policy's variables are updated by it.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf


def categorical_projection(reward: tf.Tensor, discount: tf.Tensor, probs: tf.Tensor,
                           atoms: tf.Tensor) -> tf.Tensor:
    """Project ``R + D z`` with probabilities ``probs`` onto ``atoms``; see the module docstring.

    Args:
      reward: ``[B]`` n-step returns ``R``.
      discount: ``[B]`` bootstrap discounts ``D`` (0 at terminals).
      probs: ``[B, N]`` target probabilities ``p_j``.
      atoms: ``[N]`` support, evenly spaced.

    Returns:
      ``[B, N]`` projected probabilities ``m_i``.
    """
    atoms = tf.cast(atoms, tf.float32)
    v_min, v_max = atoms[0], atoms[-1]
    dz = atoms[1] - atoms[0]
    tz = tf.clip_by_value(reward[:, None] + discount[:, None] * atoms[None, :], v_min, v_max)   # [B, N_j]
    # weight of source atom j on support atom i: max(0, 1 - |Tz_j - z_i| / dz)   -> [B, N_i, N_j]
    w = tf.maximum(0.0, 1.0 - tf.abs(tz[:, None, :] - atoms[None, :, None]) / dz)
    return tf.reduce_sum(w * probs[:, None, :], axis=-1)


def categorical_projection_np(reward, discount, probs, atoms) -> np.ndarray:
    """The floor/ceil form of the same projection in numpy (a reference for tests)."""
    reward, discount = np.asarray(reward, np.float64), np.asarray(discount, np.float64)
    probs, atoms = np.asarray(probs, np.float64), np.asarray(atoms, np.float64)
    dz = atoms[1] - atoms[0]
    out = np.zeros_like(probs)
    for b in range(probs.shape[0]):
        for j, z in enumerate(atoms):
            tz = min(max(reward[b] + discount[b] * z, atoms[0]), atoms[-1])
            pos = min(max((tz - atoms[0]) / dz, 0.0), len(atoms) - 1.0)  # float round-off at the ends
            lo, hi = int(np.floor(pos)), int(np.ceil(pos))
            if lo == hi:
                out[b, lo] += probs[b, j]
            else:
                out[b, lo] += probs[b, j] * (hi - pos)
                out[b, hi] += probs[b, j] * (pos - lo)
    return out


def critic_loss(logits: tf.Tensor, target_probs: tf.Tensor) -> tf.Tensor:
    """Per-row cross-entropy ``-sum_i m_i log softmax(logits)_i`` (``m`` is a constant)."""
    return tf.nn.softmax_cross_entropy_with_logits(labels=tf.stop_gradient(target_probs), logits=logits)


def expected_value(logits: tf.Tensor, atoms: tf.Tensor) -> tf.Tensor:
    """``Q = sum_i softmax(logits)_i z_i``, shape ``[B]``."""
    return tf.reduce_sum(tf.nn.softmax(logits, axis=-1) * atoms[None, :], axis=-1)
