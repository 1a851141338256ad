"""Adam as one fused kernel per variable, on a Keras ``Adam``'s own slot variables.

Keras 3's ``Adam.apply_gradients`` runs about 15 small ops per variable
(casts, powers, ``assign_add`` of each moment, the update) plus its global
norm clip; in a learner's K-step ``tf.function`` loop each is one graph-
executor dispatch. :func:`apply_adam` computes the same update with
``ResourceApplyAdam``, one op per variable::

    alpha = lr * sqrt(1 - b2^t) / (1 - b1^t)            # t = optimizer.iterations + 1
    m    += (g - m) * (1 - b1)
    v    += (g^2 - v) * (1 - b2)
    var  -= m * alpha / (sqrt(v) + eps)

after clipping by the global norm as Keras does
(``g *= c * min(1/||g||, 1/c) + (||g|| - ||g||)``: NaN when the norm is not
finite). The moments live in the Keras optimizer's variables, so checkpoints
(:func:`core.agents.variables.optimizer_state`) keep their keys and an old
checkpoint restores. The result equals Keras's to float rounding, not bit for
bit (TF's fused Eigen kernel orders the float ops its own way); it is
deterministic, so the same seed still gives the same parameters everywhere.

Example::

    optimizer = keras.optimizers.Adam(1e-3, global_clipnorm=10.0)
    optimizer.build(q.trainable_variables)
    grads = tape.gradient(loss, q.trainable_variables)
    apply_adam(optimizer, grads, q.trainable_variables)     # inside a tf.function
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf


def clip_by_global_norm(grads: Sequence[tf.Tensor], clip_norm: float) -> list:
    """Keras's global-norm clip (``keras.src.optimizers.base_optimizer.clip_by_global_norm``)."""
    norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g)) for g in grads]))
    scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm) + (norm - norm)
    return [g * scale for g in grads]


def apply_adam(optimizer, grads: Sequence[tf.Tensor], variables: Sequence) -> None:
    """One Adam step of ``variables`` with ``optimizer``'s hyperparameters and slots (see module docstring).

    ``optimizer`` is a built ``keras.optimizers.Adam`` without amsgrad or
    weight decay; its ``global_clipnorm`` (if set) is applied first and its
    ``iterations`` counter advances by one, as ``apply_gradients`` would.
    """
    if optimizer.amsgrad or optimizer.weight_decay:
        raise ValueError("apply_adam implements plain Adam: amsgrad and weight_decay are not supported")
    if optimizer.global_clipnorm:
        grads = clip_by_global_norm(grads, float(optimizer.global_clipnorm))
    step = tf.cast(optimizer.iterations + 1, tf.float32)
    beta_1, beta_2 = tf.constant(optimizer.beta_1, tf.float32), tf.constant(optimizer.beta_2, tf.float32)
    hyper = {"beta1_power": tf.pow(beta_1, step), "beta2_power": tf.pow(beta_2, step),
             "lr": tf.cast(optimizer.learning_rate, tf.float32), "beta1": beta_1, "beta2": beta_2,
             "epsilon": tf.constant(optimizer.epsilon, tf.float32)}
    for grad, var in zip(grads, variables):
        i = optimizer._get_variable_index(var)
        tf.raw_ops.ResourceApplyAdam(var=var.value.handle, m=optimizer._momentums[i].value.handle,
                                     v=optimizer._velocities[i].value.handle, grad=grad, **hyper)
    optimizer.iterations.assign_add(1)
