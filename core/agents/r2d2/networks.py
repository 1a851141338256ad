r"""R2D2's recurrent Q-network as one flat-in, flat-out Keras model (so actors run it in LiteRT).

The network is one recurrent *step*::

    input  [obs (D), h (H), c (H)]                       float32 [B, D + 2H]
    x      = torso(obs)                                  ReLU Dense layers, or the Nature CNN (pixels)
    i,f,g,o = split(W [x, h] + b, 4)                     one Dense(4H) on the concatenation
    c'     = sigmoid(f + 1) * c + sigmoid(i) * tanh(g)   (forget bias 1, as keras.layers.LSTM)
    h'     = sigmoid(o) * tanh(c')
    q      = MLP_head(h') -> Dense(A)                    or, dueling (Wang et al. 2016; R2D2):
    q      = V + A - mean_a A,  V = MLP_v(h') -> Dense(1),  A = MLP_a(h') -> Dense(A)
    output [q (A), h' (H), c' (H)]                       float32 [B, A + 2H]

Torsos: ``torso=[64]`` is an MLP; ``torso="nature_cnn"`` is the Nature-DQN
conv torso of :func:`core.networks.nature_cnn_layers` on the flat
``84*84*k`` stacked frames (``D = 84*84*k``), as in R2D2 and SEED RL's
``DuelingLSTMDQNNet`` (conv torso -> LSTM -> dueling head). SEED also feeds
the previous action and reward into the LSTM; this network does not (its
actors and the server carry only ``(h, c)``).

Why an explicit cell built from Dense + activations instead of
``keras.layers.LSTM``: the step is a plain feed-forward graph, so
:class:`core.quantize.PolicyQuantizer` converts it with
``TFLiteConverter.from_keras_model`` into builtin ops only (CONV_2D,
FULLY_CONNECTED, CONCATENATION, SLICE/SPLIT, LOGISTIC, TANH, MUL, ADD, MEAN),
int8-dynamic quantizes its conv and Dense kernels, and the flat single
input/output keeps every consumer of a :class:`core.quantize.PolicyPayload`
(``LiteRTPolicy``, the quantizer's weight patcher, the quality probe)
unchanged. The state travels outside the model: actors carry it
(:class:`core.agents.r2d2.actor.LSTMCarry`) and store the state each step
started from as replay extras ``lstm_h``/``lstm_c``; the learner unrolls the
same step over sequences (:func:`unroll`; with a conv torso, the torso and
head run once on all ``B * L`` rows and only the cell loops over time).

Layer names are explicit (``torso_*``, ``lstm_gates``, ``head_*``, ``q``,
``value_head_*``, ``value``): online and target networks share checkpoint
keys, and :func:`unroll` finds the parts of a step model by name.

Example::

    net = recurrent_q_network(obs_dim=2, num_actions=2, torso=[64], lstm_size=64, head=[64])
    q, h, c = step(net, obs, h, c, num_actions=2)      # one step, [B, 2], [B, 64], [B, 64]
    q_seq = unroll(net, obs_seq, h0, c0, 2, burn_in=10)   # [B, L, 2]
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

Torso = Union[Sequence[int], str]


def recurrent_q_network(obs_dim: int, num_actions: int, torso: Torso, lstm_size: int,
                        head: Sequence[int], name: str = "r2d2_q", seed: int = 0, dueling: bool = False,
                        frame_shape: Optional[Sequence[int]] = None, frame_stack: int = 1):
    """The step model ``[obs, h, c] -> [q, h', c']`` (see module docstring).

    Args:
      obs_dim: flat (stacked) observation size ``D``.
      torso: MLP widths, or ``"nature_cnn"`` (needs ``frame_shape``; ``D = prod(frame_shape) * frame_stack``).
      frame_shape, frame_stack: one frame's shape and the frames stacked per input (pixels only).
    """
    import keras
    from keras import layers
    d, hs = int(obs_dim), int(lstm_size)
    init = lambda i: keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731
    if torso == "nature_cnn":
        from core.networks import nature_cnn_layers
        torso_layers = nature_cnn_layers(frame_shape, frame_stack, seed, prefix="torso_")
    else:
        torso_layers = [layers.Dense(w, activation="relu", name=f"torso_{i}", kernel_initializer=init(i))
                        for i, w in enumerate(torso)]
    parts = _Parts(
        torso_layers, layers.Dense(4 * hs, name="lstm_gates", kernel_initializer=init(10)),
        [layers.Dense(w, activation="relu", name=f"head_{i}", kernel_initializer=init(20 + i))
         for i, w in enumerate(head)],
        layers.Dense(int(num_actions), name="q", kernel_initializer=init(30)),
        [layers.Dense(w, activation="relu", name=f"value_head_{i}", kernel_initializer=init(40 + i))
         for i, w in enumerate(head)] if dueling else [],
        layers.Dense(1, name="value", kernel_initializer=init(50)) if dueling else None)
    inp = keras.Input(shape=(d + 2 * hs,), dtype="float32", name="obs_and_state")
    obs, h, c = inp[:, :d], inp[:, d:d + hs], inp[:, d + hs:]
    h_new, c_new = parts.cell(parts.features(obs), h, c)
    out = layers.Concatenate(name="q_and_state")([parts.q(h_new), h_new, c_new])
    return keras.Model(inp, out, name=name)


class _Parts:
    """The layers of one recurrent Q-network, applied the same way by the step model and :func:`unroll`."""

    def __init__(self, torso: List, gates, head: List, q, value_head: List, value):
        self.torso, self.gates, self.head, self.q_layer = torso, gates, head, q
        self.value_head, self.value = value_head, value

    @classmethod
    def of(cls, net) -> "_Parts":
        """The parts of a built step model, found by layer name (module docstring)."""
        def named(prefix: str) -> List:
            found = [lyr for lyr in net.layers if lyr.name.startswith(prefix)]
            return sorted(found, key=lambda lyr: int(lyr.name[len(prefix):]))
        names = {lyr.name for lyr in net.layers}
        return cls(named("torso_"), net.get_layer("lstm_gates"), named("head_"), net.get_layer("q"),
                   named("value_head_"), net.get_layer("value") if "value" in names else None)

    @property
    def convolutional(self) -> bool:
        return any(type(layer).__name__ == "Conv2D" for layer in self.torso)

    def features(self, obs):
        for layer in self.torso:
            obs = layer(obs)
        return obs

    def cell(self, x, h, c):
        """One LSTM step: ``(h', c')`` from input features ``x`` and state ``(h, c)``."""
        from keras import ops
        hs = h.shape[-1]
        gates = self.gates(ops.concatenate([x, h], axis=-1))
        i_g, f_g, g_g, o_g = (gates[:, k * hs:(k + 1) * hs] for k in range(4))
        c_new = ops.sigmoid(f_g + 1.0) * c + ops.sigmoid(i_g) * ops.tanh(g_g)
        return ops.sigmoid(o_g) * ops.tanh(c_new), c_new

    def q(self, y):
        from keras import ops
        a = y
        for layer in self.head:
            a = layer(a)
        a = self.q_layer(a)
        if self.value is None:
            return a
        v = y
        for layer in self.value_head:
            v = layer(v)
        return self.value(v) + a - ops.mean(a, axis=-1, keepdims=True)


def step(net, obs, h, c, num_actions: int) -> Tuple:
    """One recurrent step with ``net``: returns ``(q [B, A], h' [B, H], c' [B, H])``."""
    import tensorflow as tf
    out = net(tf.concat([obs, h, c], axis=-1))
    hs = h.shape[-1]
    return out[:, :num_actions], out[:, num_actions:num_actions + hs], out[:, num_actions + hs:]


def unroll(net, obs, h0, c0, num_actions: int, burn_in: int = 0):
    """Q-values ``[B, L, A]`` of ``net`` over ``obs [B, L, D]`` from the stored state ``(h0, c0)``.

    Equal to ``L`` calls of :func:`step`. An MLP torso runs exactly those
    calls (the step model the actors run, bit for bit); a conv torso runs
    once on all ``B * L`` rows and only the cell loops over time (``L``
    copies of the conv stack would make a large graph of small convolutions).
    The first ``burn_in`` steps only warm the state up (R2D2's burn-in):
    their states (and Q-values) are cut with ``tf.stop_gradient``, so no
    gradient reaches their observations or the stored start state. An MLP
    torso's steps run in graph loops (:func:`_unroll_steps`: the same values,
    one trace of the step model); a conv torso's ``L`` (static) cell steps
    unroll in the graph.
    """
    import tensorflow as tf
    parts = _Parts.of(net)
    if not parts.convolutional:
        return _unroll_steps(net, obs, h0, c0, num_actions, burn_in)
    b, length = tf.shape(obs)[0], obs.shape[1]     # the batch may be dynamic, the length not
    feats = parts.features(tf.reshape(obs, [b * length, -1]))
    feats = tf.reshape(feats, [b, length, -1])
    hs_seq = []
    h, c = h0, c0
    for t in range(length):
        h, c = parts.cell(feats[:, t], h, c)
        if t < burn_in:
            h, c = tf.stop_gradient(h), tf.stop_gradient(c)
        hs_seq.append(h)
    q = parts.q(tf.reshape(tf.stack(hs_seq, axis=1), [b * length, -1]))
    return tf.reshape(q, [b, length, num_actions])


def _unroll_steps(net, obs, h0, c0, num_actions: int, burn_in: int):
    """:func:`unroll` as ``L`` calls of the step model, in two graph loops: the burn-in steps (cut from the
    gradient) and the learning steps. A loop traces the step model once, not ``L`` times: an R2D2 learner's
    first step (trace and graph optimization) took 7-9 s with the ``L`` calls unrolled in the graph, 1.6-2.4 s
    in loops (benchmarks/micro/r2d2_first_step.py)."""
    import tensorflow as tf
    length = obs.shape[1]
    steps = tf.transpose(obs, [1, 0, 2])            # [L, B, D]: step t reads row t

    def run(first: int, last: int, h, c):
        """Steps ``first .. last - 1`` from state ``(h, c)``: Q-values ``[last - first, B, A]`` and the state."""
        def body(t, h, c, qs):
            q, h, c = step(net, steps[t], h, c, num_actions)
            return t + 1, h, c, qs.write(t - first, q)
        qs = tf.TensorArray(obs.dtype, size=last - first, element_shape=[None, num_actions])
        _, h, c, qs = tf.while_loop(lambda t, *_: t < last, body, (tf.constant(first), h, c, qs),
                                    maximum_iterations=last - first)
        return qs.stack(), h, c

    burn = min(burn_in, length)
    parts = []
    h, c = h0, c0
    if burn > 0:
        q_burn, h, c = run(0, burn, h, c)
        q_burn, h, c = tf.stop_gradient(q_burn), tf.stop_gradient(h), tf.stop_gradient(c)
        parts.append(q_burn)
    if burn < length:
        parts.append(run(burn, length, h, c)[0])
    return tf.transpose(tf.concat(parts, axis=0), [1, 0, 2])    # [B, L, A]
