"""The int8 rule: symmetric per-channel weight quantization, its inverse, and how much it costs.

Quantization scale rule (what the TFLite converter writes, and what
:func:`quantize_symmetric` reproduces bit for bit)::

    weights, symmetric, per output channel c (per-tensor: c = everything):
        scale_c = max_i |w_ci| / 127            zero_point = 0
        q_ci    = clip(round(127 * w_ci / max_i |w_ci|), -127, 127)   (int8)
        w_ci   ~= scale_c * q_ci,    |w_ci - scale_c * q_ci| <= scale_c / 2
    activations (int8-full only), affine per tensor, from the calibration range
    [a_min, a_max] (widened to include 0):
        scale = (a_max - a_min) / 255,  zero_point = round(-128 - a_min / scale)
        a ~= scale * (q - zero_point)
    bias (int8-full): int32 with scale = input_scale * weight_scale_c.

:func:`weight_quantization_error` and :func:`action_agreement` measure what the
rule costs a policy (:mod:`core.quality` reports them).

Example::

    q, scale = quantize_symmetric(kernel, axis=-1)     # Keras kernels are [in, out]
    error = np.abs(kernel - dequantize(q, scale, axis=-1)).max()   # <= scale.max() / 2
"""
from __future__ import annotations

import numpy as np

INT8_MAX = 127
# The converter's range for an all-zero weight channel is [-5e-7, 5e-7].
_ZERO_CHANNEL_MAX = 5e-7


def quantize_symmetric(w: np.ndarray, axis: int | None = 0) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantization, per channel along ``axis`` (None: per tensor).

    ``scale = max|w| / 127`` over the other axes, zero point 0,
    ``q = clip(round(127 * w / max|w|), -127, 127)`` with round-half-away-from-zero
    in float64: exactly what the TFLite converter writes for weights.

    Returns:
      ``(q, scale)``: int8 array shaped like ``w``, float32 scales (shape
      ``[w.shape[axis]]``, or ``[1]`` per tensor).
    """
    w32 = np.asarray(w, dtype=np.float32)
    if axis is None:
        max_abs = np.abs(w32).max(keepdims=True).reshape(1)
        bshape = (1,) * w32.ndim
    else:
        other = tuple(i for i in range(w32.ndim) if i != axis % w32.ndim)
        max_abs = np.abs(w32).max(axis=other)
        bshape = [1] * w32.ndim
        bshape[axis] = -1
    max_abs = np.where(max_abs == 0.0, np.float32(_ZERO_CHANNEL_MAX), max_abs).astype(np.float32)
    # float32 first (fast); its error (< 1e-4) only matters next to a .5 tie,
    # so those few elements are redone exactly in float64.
    scaled = w32 * (np.float32(INT8_MAX) / max_abs).reshape(bshape)
    rounded = np.rint(scaled)
    near_tie = np.nonzero(np.abs(np.abs(scaled - rounded) - 0.5) < 1e-3)
    if near_tie[0].size:
        max64 = np.broadcast_to(max_abs.reshape(bshape).astype(np.float64), w32.shape)[near_tie]
        exact = w32[near_tie].astype(np.float64) * INT8_MAX / max64
        rounded[near_tie] = np.trunc(exact + np.copysign(0.5, exact))
    q = np.clip(rounded, -INT8_MAX, INT8_MAX).astype(np.int8)
    scale = (max_abs.astype(np.float32) / np.float32(INT8_MAX)).astype(np.float32)
    return q, scale


def dequantize(q: np.ndarray, scale: np.ndarray, axis: int | None = 0) -> np.ndarray:
    """``scale_c * q`` in float64 (the inverse of :func:`quantize_symmetric`)."""
    s = np.asarray(scale, np.float64)
    if axis is not None:
        bshape = [1] * q.ndim
        bshape[axis] = -1
        s = s.reshape(bshape)
    return q.astype(np.float64) * s


def _dense_layers(model) -> list:
    return [layer for layer in model.layers if hasattr(layer, "kernel") and layer.get_weights()]


def weight_quantization_error(keras_model, scheme: str = "per-channel") -> dict[str, float]:
    """Relative int8 weight error per dense layer: ``||W - dq(q(W))||_2 / ||W||_2``.

    Args:
      keras_model: the fp32 policy network.
      scheme: ``"per-channel"`` (one scale per output unit, what int8 payloads
        use) or ``"per-tensor"``.

    Returns:
      ``{layer_name: relative_error}`` for each layer with a kernel.
    """
    if scheme not in ("per-channel", "per-tensor"):
        raise ValueError(f"unknown quantization scheme {scheme!r}; valid: per-channel, per-tensor")
    axis = -1 if scheme == "per-channel" else None  # Keras kernels are [in, out]
    errors = {}
    for layer in _dense_layers(keras_model):
        w = np.asarray(layer.get_weights()[0], np.float64)
        q, scale = quantize_symmetric(w, axis=axis)
        norm = float(np.linalg.norm(w))
        errors[layer.name] = float(np.linalg.norm(w - dequantize(q, scale, axis))) / norm if norm else 0.0
    return errors


def action_agreement(fp32_out: np.ndarray, q_out: np.ndarray, discrete: bool = True) -> float:
    """How closely a quantized policy acts like the fp32 one on the same observations.

    Discrete (Q-values / logits ``[B, A]``): fraction of rows with equal argmax
    (1.0 is perfect). Continuous (actions ``[B, act_dim]``): mean absolute
    action difference (0.0 is perfect).
    """
    a, b = np.asarray(fp32_out), np.asarray(q_out)
    if a.shape != b.shape:
        raise ValueError(f"action_agreement needs equal shapes, got {a.shape} and {b.shape}")
    if discrete:
        return float(np.mean(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))
    return float(np.mean(np.abs(a.astype(np.float64) - b.astype(np.float64))))

