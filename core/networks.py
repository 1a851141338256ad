"""Keras networks shared by agents and quantizers.

Policies sent to actors are plain ``keras.Sequential`` MLPs (or CNN torsos
for pixels) with a fixed input signature, so that the quantizer can convert
them with ``TFLiteConverter.from_keras_model`` (the path that supports full
int8 calibration; see shared/PLATFORM_FACTS.md).

Example::

    q_net = mlp(obs_dim=4, hidden=(256, 256), out_dim=2, name="q")
    q_values = q_net(np.zeros((1, 4), np.float32))   # [1, 2]
    torso = nature_cnn_layers((84, 84), frame_stack=4)  # flat [B, 84*84*4] -> [B, 512] (V-trace, R2D2)
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def _keras():
    import keras  # imported lazily: actors never need TF/Keras
    return keras


def mlp(obs_dim: int, hidden: Sequence[int], out_dim: int, name: str = "mlp",
        activation: str = "relu", seed: int = 0, output_activation: str | None = None):
    """A ReLU MLP ``obs_dim -> hidden... -> out_dim`` with Glorot-uniform weights.

    Args:
      obs_dim: flat observation size.
      hidden: hidden layer widths, e.g. ``(256, 256)`` or ActorQ's ``(2048,) * 3``.
      out_dim: number of outputs (actions for a Q-network).
      name: model name; layer names are ``{name}/dense_{i}``.
      activation: hidden activation.
      seed: initializer seed, so equal seeds give equal initial weights.
      output_activation: e.g. ``"tanh"`` for deterministic continuous policies.
    """
    keras = _keras()
    layers = [keras.Input(shape=(obs_dim,), dtype="float32", name="observation")]
    for i, width in enumerate(hidden):
        layers.append(keras.layers.Dense(
            width, activation=activation, name=f"dense_{i}",
            kernel_initializer=keras.initializers.GlorotUniform(seed=seed + i)))
    layers.append(keras.layers.Dense(
        out_dim, activation=output_activation, name=f"dense_{len(hidden)}",
        kernel_initializer=keras.initializers.GlorotUniform(seed=seed + len(hidden))))
    return keras.Sequential(layers, name=name)


def nature_cnn_layers(obs_shape: Sequence[int], frame_stack: int = 1, seed: int = 0,
                      prefix: str | None = None) -> list:
    """The Nature-DQN torso (Mnih et al. 2015) as layers: flat ``H*W*C*k`` input -> 512 ReLU features.

    Reshape to ``[H, W, C*k]`` (stacked frames on the channel axis, the order
    the inference server's FrameStacker and ``stack_frames`` use), scale by
    1/255 inside the network (actors feed raw uint8 values as float32), then
    conv 32x8x8/4, conv 64x4x4/2, conv 64x3x3/1, flatten, dense 512.
    Initializers are Glorot-uniform seeded ``seed + 0..3``. Used by V-trace's
    policy/value networks and R2D2's recurrent Q-network (SEED RL's Atari
    torso for both agents).

    Args:
      obs_shape: one frame, ``(H, W)`` or ``(H, W, C)``.
      frame_stack: frames stacked on the channel axis.
      seed: initializer seed.
      prefix: layer names ``{prefix}0 .. {prefix}6``; None lets Keras name them.
    """
    keras = _keras()
    h, w = int(obs_shape[0]), int(obs_shape[1])
    c = (int(obs_shape[2]) if len(obs_shape) > 2 else 1) * int(frame_stack)
    init = lambda i: keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731
    names = iter([f"{prefix}{i}" for i in range(7)] if prefix is not None else [None] * 7)
    return [
        keras.layers.Reshape((h, w, c), name=next(names)),
        keras.layers.Rescaling(1.0 / 255.0, name=next(names)),
        keras.layers.Conv2D(32, 8, strides=4, activation="relu", kernel_initializer=init(0), name=next(names)),
        keras.layers.Conv2D(64, 4, strides=2, activation="relu", kernel_initializer=init(1), name=next(names)),
        keras.layers.Conv2D(64, 3, strides=1, activation="relu", kernel_initializer=init(2), name=next(names)),
        keras.layers.Flatten(name=next(names)),
        keras.layers.Dense(512, activation="relu", kernel_initializer=init(3), name=next(names)),
    ]


def get_weights(model) -> list[np.ndarray]:
    """The model's weights as a list of numpy arrays (host copies)."""
    return [np.array(w) for w in model.get_weights()]


def copy_weights(src, dst) -> None:
    """Set ``dst``'s weights to ``src``'s (e.g. target-network update)."""
    dst.set_weights(src.get_weights())
