"""V-trace networks: a policy network sent to actors and a value network kept on the learner.

The policy is a plain ``keras.Sequential`` that maps a *flat* float32
observation to action logits, so :mod:`core.quantize` can convert it to an
fp32/int8 LiteRT flatbuffer and actors (or the central inference server) run
it without TensorFlow. The value head is a separate network: it never leaves
the learner, so it costs no broadcast bytes.

* ``mlp``: ``obs_dim -> hidden... -> out`` ReLU MLP (:func:`core.networks.mlp`).
* ``nature_cnn``: the DQN Nature torso (Mnih et al. 2015): input is the flat
  ``84*84*k`` uint8-valued frame stack, reshaped to ``[84, 84, k]`` and scaled
  by 1/255 inside the network, then conv 32x8x8/4, conv 64x4x4/2, conv
  64x3x3/1, dense 512, linear head. Frames are stacked along channels.

Example::

    policy = policy_network(env_spec("CartPole-v1"), cfg)   # [B, 4] -> [B, 2] logits
    value = value_network(env_spec("CartPole-v1"), cfg)     # [B, 4] -> [B, 1]
"""
from __future__ import annotations

from typing import Sequence, Tuple

from core.networks import mlp, nature_cnn_layers


def input_dim(obs_shape: Tuple[int, ...], frame_stack: int = 1) -> int:
    """Flat network input size: one observation times the number of stacked frames."""
    n = 1
    for d in obs_shape:
        n *= int(d)
    return n * int(frame_stack)


def nature_cnn(obs_shape: Tuple[int, ...], frame_stack: int, out_dim: int, name: str, seed: int = 0):
    """Nature-DQN conv torso (:func:`core.networks.nature_cnn_layers`) + linear head on a flat ``H*W*C*k`` input."""
    import keras
    n = input_dim(obs_shape, frame_stack)
    return keras.Sequential([
        keras.Input(shape=(n,), dtype="float32", name="observation"),
        *nature_cnn_layers(obs_shape, frame_stack, seed),
        keras.layers.Dense(out_dim, kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 4)),
    ], name=name)


def _net(spec, cfg, out_dim: int, name: str, seed: int):
    if cfg.torso == "nature_cnn":
        return nature_cnn(spec.obs_shape, cfg.frame_stack, out_dim, name, seed)
    return mlp(input_dim(spec.obs_shape, cfg.frame_stack), list(cfg.hidden), out_dim, name=name, seed=seed)


def policy_network(spec, cfg, seed: int = 0):
    """Logits network ``[B, input_dim] -> [B, num_actions]`` (the one actors run)."""
    return _net(spec, cfg, spec.num_actions, "policy", seed)


def value_network(spec, cfg, seed: int = 0):
    """State-value network ``[B, input_dim] -> [B, 1]`` (learner only)."""
    return _net(spec, cfg, 1, "value", seed + 1000)
