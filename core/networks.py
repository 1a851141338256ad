"""Keras networks shared by agents and quantizers.

Policies sent to actors are plain ``keras.Sequential`` MLPs (or CNN torsos
for pixels) with a fixed input signature, so that the quantizer can convert
them with ``TFLiteConverter.from_keras_model`` (the path that supports full
int8 calibration; see shared/PLATFORM_FACTS.md).

Example::

    q_net = mlp(obs_dim=4, hidden=(256, 256), out_dim=2, name="q")
    q_values = q_net(np.zeros((1, 4), np.float32))   # [1, 2]
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


def get_weights(model) -> list[np.ndarray]:
    """The model's weights as a list of numpy arrays (host copies)."""
    return [np.array(w) for w in model.get_weights()]


def copy_weights(src, dst) -> None:
    """Set ``dst``'s weights to ``src``'s (e.g. target-network update)."""
    dst.set_weights(src.get_weights())
