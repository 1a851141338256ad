"""Precision modes: the four precisions a policy payload can have, and the TFLite conversion of each.

Precisions:

* ``fp32``: float weights and kernels (the baseline).
* ``fp16``: float16 weights, dequantized to fp32 at load (half the bytes).
* ``int8-dynamic``: int8 weights (dense kernels with >= 1024 elements; smaller
  ones stay fp32, the converter's rule); activations are quantized to int8 at
  run time per batch, so no calibration is needed.
* ``int8-full``: int8 weights *and* activations, calibrated on recent
  observations (from replay); the model keeps a float32 input and output
  (QUANTIZE / DEQUANTIZE ops at its edges), so actors feed float observations.

The int8 scale rule is in :mod:`core.quantize.int8`. :func:`convert` costs
0.2-1.5 s per version (shared/PLATFORM_FACTS.md); :mod:`core.quantize.flatbuffer`
and :class:`core.quantize.quantizers.AsyncQuantizer` keep it off the learner's path.

Example::

    data = convert(q_net, "int8-full", calibration_obs=replay_obs)   # TFLite flatbuffer bytes
"""
from __future__ import annotations

import contextlib

import numpy as np

PRECISIONS = ("fp32", "fp16", "int8-dynamic", "int8-full")
PATCHABLE_PRECISIONS = ("fp32", "fp16", "int8-dynamic")


def check_precision(precision: str) -> str:
    """Returns ``precision`` or raises a one-line ValueError naming the valid ones."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown policy precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    return precision


@contextlib.contextmanager
def _quiet_keras():
    """Silence Keras' "Saved artifact at ..." export print, in this thread only."""
    try:
        from keras.src.backend.common import global_state  # thread-local settings
    except ImportError:  # a Keras without this private module: just stay verbose
        yield
        return
    previous = global_state.get_global_attribute("interactive_logging", True)
    global_state.set_global_attribute("interactive_logging", False)
    try:
        yield
    finally:
        global_state.set_global_attribute("interactive_logging", previous)


def _model_dims(model) -> tuple[int, int]:
    return int(model.inputs[0].shape[-1]), int(model.outputs[0].shape[-1])


def _calibration_batches(obs: np.ndarray, samples: int, batch: int = 32):
    """Evenly spaced rows of ``obs`` (at most ``samples``), in batches, as the converter wants."""
    idx = np.linspace(0, len(obs) - 1, num=min(samples, len(obs))).round().astype(int)
    rows = np.ascontiguousarray(obs[idx], dtype=np.float32)

    def representative_dataset():
        for i in range(0, len(rows), batch):
            yield [rows[i:i + batch]]
    return representative_dataset


def convert(model, precision: str, calibration_obs: np.ndarray | None = None,
            calibration_samples: int = 256) -> bytes:
    """TFLite flatbuffer of ``model`` at ``precision`` (``TFLiteConverter.from_keras_model``)."""
    import tensorflow as tf
    check_precision(precision)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if precision != "fp32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if precision == "fp16":
        converter.target_spec.supported_types = [tf.float16]
    if precision == "int8-full":
        converter.representative_dataset = _calibration_batches(calibration_obs, calibration_samples)
        # Fail loudly rather than silently leave float ops; in/out stay float32.
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    with _quiet_keras():
        return bytes(converter.convert())


def _check_calibration(obs, precision: str, input_dim: int) -> np.ndarray | None:
    if precision != "int8-full":
        return None
    if obs is None or len(obs) == 0:
        raise ValueError("precision 'int8-full' needs calibration_obs: an [N, obs_dim] float array "
                         "of recent observations (e.g. from replay); or use 'int8-dynamic'")
    obs = np.asarray(obs, np.float32)
    if obs.ndim != 2 or obs.shape[1] != input_dim:
        raise ValueError(f"calibration_obs must be [N, {input_dim}], got shape {obs.shape}")
    return obs
