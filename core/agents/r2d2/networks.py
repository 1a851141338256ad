r"""R2D2's recurrent Q-network as one flat-in, flat-out Keras model (so actors run it in LiteRT).

The network is one recurrent *step*::

    input  [obs (D), h (H), c (H)]                       float32 [B, D + 2H]
    x      = MLP_torso(obs)                              ReLU Dense layers
    i,f,g,o = split(W [x, h] + b, 4)                     one Dense(4H) on the concatenation
    c'     = sigmoid(f + 1) * c + sigmoid(i) * tanh(g)   (forget bias 1, as keras.layers.LSTM)
    h'     = sigmoid(o) * tanh(c')
    q      = MLP_head(h') -> Dense(A)
    output [q (A), h' (H), c' (H)]                       float32 [B, A + 2H]

Why an explicit cell built from Dense + activations instead of
``keras.layers.LSTM``: the step is a plain feed-forward graph, so
:class:`core.quantize.PolicyQuantizer` converts it with
``TFLiteConverter.from_keras_model`` into builtin ops only (FULLY_CONNECTED,
CONCATENATION, SLICE/SPLIT, LOGISTIC, TANH, MUL, ADD), int8-dynamic quantizes
its Dense kernels, and the flat single input/output keeps every consumer of a
:class:`core.quantize.PolicyPayload` (``LiteRTPolicy``, the quantizer's
weight patcher, the quality probe) unchanged. The state travels outside the
model: actors carry it (:class:`core.agents.r2d2.actor.LSTMCarry`) and store
the state each step started from as replay extras ``lstm_h``/``lstm_c``; the
learner unrolls the same step over sequences (:func:`unroll`).

Example::

    net = recurrent_q_network(obs_dim=2, num_actions=2, torso=[64], lstm_size=64, head=[64])
    q, h, c = step(net, obs, h, c, num_actions=2)      # one step, [B, 2], [B, 64], [B, 64]
"""
from __future__ import annotations

from typing import Sequence, Tuple


def recurrent_q_network(obs_dim: int, num_actions: int, torso: Sequence[int], lstm_size: int,
                        head: Sequence[int], name: str = "r2d2_q", seed: int = 0):
    """The step model ``[obs, h, c] -> [q, h', c']`` (see module docstring)."""
    import keras
    from keras import layers, ops
    d, hs = int(obs_dim), int(lstm_size)
    init = lambda i: keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731
    inp = keras.Input(shape=(d + 2 * hs,), dtype="float32", name="obs_and_state")
    obs, h, c = inp[:, :d], inp[:, d:d + hs], inp[:, d + hs:]
    x = obs
    for i, width in enumerate(torso):
        x = layers.Dense(width, activation="relu", name=f"torso_{i}", kernel_initializer=init(i))(x)
    gates = layers.Dense(4 * hs, name="lstm_gates", kernel_initializer=init(10))(layers.Concatenate()([x, h]))
    i_g, f_g, g_g, o_g = (gates[:, k * hs:(k + 1) * hs] for k in range(4))
    c_new = ops.sigmoid(f_g + 1.0) * c + ops.sigmoid(i_g) * ops.tanh(g_g)
    h_new = ops.sigmoid(o_g) * ops.tanh(c_new)
    y = h_new
    for i, width in enumerate(head):
        y = layers.Dense(width, activation="relu", name=f"head_{i}", kernel_initializer=init(20 + i))(y)
    q = layers.Dense(int(num_actions), name="q", kernel_initializer=init(30))(y)
    out = layers.Concatenate(name="q_and_state")([q, h_new, c_new])
    return keras.Model(inp, out, name=name)


def step(net, obs, h, c, num_actions: int) -> Tuple:
    """One recurrent step with ``net``: returns ``(q [B, A], h' [B, H], c' [B, H])``."""
    import tensorflow as tf
    out = net(tf.concat([obs, h, c], axis=-1))
    hs = h.shape[-1]
    return out[:, :num_actions], out[:, num_actions:num_actions + hs], out[:, num_actions + hs:]


def unroll(net, obs, h0, c0, num_actions: int, burn_in: int = 0):
    """Q-values ``[B, L, A]`` of ``net`` over ``obs [B, L, D]`` from the stored state ``(h0, c0)``.

    The first ``burn_in`` steps only warm the state up (R2D2's burn-in): they
    run under ``tf.stop_gradient``, so no gradient reaches them or the
    stored start state; their Q-values are returned (for inspection) but
    also carry no gradient. ``L`` is static, so the loop unrolls in the graph.
    """
    import tensorflow as tf
    qs = []
    h, c = h0, c0
    for t in range(obs.shape[1]):
        q, h, c = step(net, obs[:, t], h, c, num_actions)
        if t < burn_in:
            q, h, c = tf.stop_gradient(q), tf.stop_gradient(h), tf.stop_gradient(c)
        qs.append(q)
    return tf.stack(qs, axis=1)
