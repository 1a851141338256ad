r"""V-trace targets and the IMPALA actor-critic loss.

**V-trace** (Espeholt et al. 2018, eq. 1, in its recursive form). For an
unroll of transitions ``t = 0..T-1`` from behaviour policy ``mu`` (the logits
that actually acted, quantized or not) and target policy ``pi``::

    ratio_t = pi(a_t | x_t) / mu(a_t | x_t)
    rho_t   = min(rho_bar, ratio_t)
    c_t     = lambda * min(c_bar, ratio_t)
    g_t     = gamma * discount_{t+1}          (0 if x_{t+1} is terminal)
    delta_t = rho_t * (r_t + g_t V(x_{t+1}) - V(x_t))

    v_t - V(x_t) = delta_t + g_t c_t (v_{t+1} - V(x_{t+1})),   v_T - V(x_T) = 0

so ``v_s = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} g_i c_i) delta_t``. The value
head regresses ``V(x_t)`` onto ``v_t``; the policy gradient uses

    A_t = min(pg_rho_bar, ratio_t) * (r_t + g_t v_{t+1} - V(x_t)).

**Episode ends inside an unroll.** Replay sequences follow the RLDS rows of
:mod:`core.trajectory`: the last row of an episode holds the final
observation and no real action. ``valid_t`` is False for such rows and for
padding after them; the recursion is cut there (``v_{t+1} - V(x_{t+1}) = 0``
for an invalid ``t+1``), so a transition into a *terminated* row has
``g_t = 0`` (no bootstrap) and one into a *truncated* row bootstraps from
``V`` of its final observation: ``v_t = V(x_t) + delta_t``.

With ``rho_bar = c_bar = lambda = 1`` and on-policy data, ``v_s`` is the
n-step return bootstrapped at the unroll's end (the classic A2C target).

Example::

    vs, adv = vtrace_targets(log_rhos, discounts, rewards, values, next_values, valid)
"""
from __future__ import annotations

from typing import Tuple

import tensorflow as tf


def vtrace_targets(log_rhos, discounts, rewards, values, next_values, valid, rho_bar: float = 1.0,
                   c_bar: float = 1.0, lam: float = 1.0, pg_rho_bar: float = 1.0) -> Tuple[tf.Tensor, tf.Tensor]:
    """V-trace value targets ``v_t`` and policy-gradient advantages ``A_t``, time-major ``[T, B]``.

    Args:
      log_rhos: ``log pi(a_t|x_t) - log mu(a_t|x_t)``.
      discounts: ``g_t = gamma * discount_{t+1}``.
      rewards: ``r_t``.
      values: ``V(x_t)``.
      next_values: ``V(x_{t+1})`` (the bootstrap for the last transition included).
      valid: 1 where transition ``t`` is real, 0 on last/padding rows.
    Returns:
      ``(vs, pg_advantages)``, both ``[T, B]`` and zero-gradient.
    """
    f32 = lambda x: tf.cast(tf.convert_to_tensor(x), tf.float32)  # noqa: E731
    log_rhos, discounts, rewards, values, next_values, valid = map(
        f32, (log_rhos, discounts, rewards, values, next_values, valid))
    ratio = tf.exp(log_rhos)
    rhos = tf.minimum(rho_bar, ratio)
    cs = lam * tf.minimum(c_bar, ratio)
    deltas = valid * rhos * (rewards + discounts * next_values - values)
    decay = valid * discounts * cs

    def backward(acc_next, x):
        delta, dec, ok = x
        return ok * (delta + dec * acc_next)   # acc_t = v_t - V(x_t); 0 where invalid

    acc = tf.scan(backward, (deltas, decay, valid), initializer=tf.zeros_like(values[0]), reverse=True)
    vs = values + acc
    acc_next = tf.concat([acc[1:], tf.zeros_like(acc[:1])], axis=0)
    vs_next = next_values + acc_next
    adv = valid * tf.minimum(pg_rho_bar, ratio) * (rewards + discounts * vs_next - values)
    return tf.stop_gradient(vs), tf.stop_gradient(adv)


def actor_critic_loss(logits, behaviour_logits, actions, values, next_values, rewards, discounts, valid, cfg):
    """IMPALA loss on time-major ``[T, B]`` tensors (``logits`` ``[T, B, A]``).

        loss = -mean(log pi(a_t|x_t) A_t)
               + baseline_cost * mean((v_t - V(x_t))^2) / 2
               - entropy_cost * mean(H(pi(.|x_t)))

    means over valid transitions only. Returns ``(loss, metrics dict)``.
    """
    logp = tf.nn.log_softmax(logits)
    mu_logp = tf.nn.log_softmax(behaviour_logits)
    logp_a = tf.gather(logp, actions, axis=-1, batch_dims=2)
    mu_logp_a = tf.gather(mu_logp, actions, axis=-1, batch_dims=2)
    log_rhos = tf.stop_gradient(logp_a - mu_logp_a)
    vs, adv = vtrace_targets(log_rhos, discounts, rewards, tf.stop_gradient(values), tf.stop_gradient(next_values),
                             valid, cfg.rho_bar, cfg.c_bar, cfg.td_lambda, cfg.pg_rho_bar)
    n = tf.maximum(tf.reduce_sum(valid), 1.0)
    pg_loss = -tf.reduce_sum(valid * logp_a * adv) / n
    baseline_loss = 0.5 * tf.reduce_sum(valid * tf.square(vs - values)) / n
    entropy = -tf.reduce_sum(tf.exp(logp) * logp, axis=-1)
    entropy_mean = tf.reduce_sum(valid * entropy) / n
    loss = pg_loss + cfg.baseline_cost * baseline_loss - cfg.entropy_cost * entropy_mean
    rho_mean = tf.reduce_sum(valid * tf.exp(log_rhos)) / n
    return loss, {"pg_loss": pg_loss, "baseline_loss": baseline_loss, "entropy": entropy_mean,
                  "value_mean": tf.reduce_sum(valid * values) / n, "rho_mean": rho_mean}
