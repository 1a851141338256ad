"""The quantizers a learner calls: PolicyQuantizer (in its thread) and AsyncQuantizer (in the background).

:class:`PolicyQuantizer` converts (:func:`core.quantize.modes.convert`) or
patches (:class:`core.quantize.flatbuffer.FlatbufferPatcher`) a Keras policy
into a :class:`core.quantize.payloads.PolicyPayload`. :class:`AsyncQuantizer`
copies the weights and does the same in a background thread on a private
clone of the network; ``latest()`` never blocks.

Example::

    quantizer = PolicyQuantizer("int8-full")
    payload = quantizer.quantize(q_net, version=7, calibration_obs=replay_obs)
"""
from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from core.quantize.flatbuffer import FlatbufferPatcher
from core.quantize.modes import PATCHABLE_PRECISIONS, _check_calibration, _model_dims, check_precision, convert
from core.quantize.payloads import PolicyPayload


class PolicyQuantizer:
    """Keras policy -> :class:`PolicyPayload` at a fixed precision.

    Args:
      precision: one of :data:`PRECISIONS`.
      calibration_samples: at most this many calibration rows are used (int8-full).
      patch: for fp32/fp16/int8-dynamic, convert once and then patch weights into
        the prebuilt flatbuffer (see :class:`FlatbufferPatcher`); ignored for
        int8-full, whose activation ranges change with the weights.
    """

    def __init__(self, precision: str = "int8-dynamic", calibration_samples: int = 256,
                 patch: bool = False):
        self.precision = check_precision(precision)
        self.calibration_samples = int(calibration_samples)
        self.patch = bool(patch) and precision in PATCHABLE_PRECISIONS
        self._patcher: FlatbufferPatcher | None = None

    def quantize(self, keras_model, version: int, calibration_obs: np.ndarray | None = None
                 ) -> PolicyPayload:
        """Converts (or patches) ``keras_model``'s current weights into version ``version``."""
        input_dim, output_dim = _model_dims(keras_model)
        obs = _check_calibration(calibration_obs, self.precision, input_dim)
        if self.patch and FlatbufferPatcher.supports(keras_model):   # conv torsos are converted each version
            if self._patcher is None or not self._patcher.matches(keras_model):
                self._patcher = FlatbufferPatcher(keras_model, self.precision)
            return self._patcher.patch(keras_model.get_weights(), version)
        start = time.perf_counter()
        data = convert(keras_model, self.precision, obs, self.calibration_samples)
        return PolicyPayload(int(version), self.precision, data, time.perf_counter() - start,
                             input_dim, output_dim, "convert")


class AsyncQuantizer:
    """Converts policy versions in a background thread; the learner never waits.

    ``submit`` copies the weights and returns at once. A daemon thread sets
    them on a *private* clone of the network (the learner's model is never
    touched concurrently) and converts, or patches when ``patch`` and the
    precision allow it. If the learner submits faster than conversion, only the
    newest pending version is kept (older ones are counted in ``dropped``).

    Example::

        aq = AsyncQuantizer(q_net, "int8-full")
        aq.submit(q_net.get_weights(), version=step, calibration=replay_obs)
        payload = aq.latest()          # newest finished payload, or None
        ...
        aq.close()
    """

    def __init__(self, model, precision: str = "int8-dynamic", *, patch: bool = True,
                 calibration_samples: int = 256):
        import keras
        self.quantizer = PolicyQuantizer(precision, calibration_samples, patch=patch)
        self._clone = keras.models.clone_model(model)
        self._clone.set_weights(model.get_weights())
        self._cond = threading.Condition()
        self._pending: tuple | None = None
        self._latest: PolicyPayload | None = None
        self._error: BaseException | None = None
        self._closed = False
        self.submitted = self.completed = self.dropped = 0
        self._done_seq = 0  # submission number of the newest finished payload
        self._thread = threading.Thread(target=self._run, name="policy-quantizer", daemon=True)
        self._thread.start()

    @property
    def precision(self) -> str:
        return self.quantizer.precision

    def submit(self, model_weights, version: int, calibration: np.ndarray | None = None) -> None:
        """Queues version ``version``; ``model_weights`` is a weight list or a Keras model."""
        self._raise_worker_error()
        if hasattr(model_weights, "get_weights"):
            model_weights = model_weights.get_weights()
        weights = [np.array(w, dtype=np.float32, copy=True) for w in model_weights]
        input_dim = int(self._clone.inputs[0].shape[-1])
        calib = _check_calibration(calibration, self.precision, input_dim)
        calib = None if calib is None else calib.copy()
        with self._cond:
            if self._closed:
                raise RuntimeError("AsyncQuantizer is closed")
            if self._pending is not None:
                self.dropped += 1
            self.submitted += 1
            self._pending = (weights, int(version), calib, self.submitted)
            self._cond.notify_all()

    def latest(self) -> PolicyPayload | None:
        """The newest finished payload (None before the first); never blocks."""
        self._raise_worker_error()
        return self._latest

    def wait(self, version: int | None = None, timeout: float | None = None) -> PolicyPayload:
        """Blocks until version >= ``version`` (default: everything submitted so far) is done."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            wanted_seq = self.submitted
            while True:
                self._raise_worker_error()
                latest = self._latest
                if latest is not None and (latest.version >= version if version is not None
                                           else self._done_seq >= wanted_seq):
                    return latest
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"policy version {version} not quantized within {timeout} s")
                self._cond.wait(remaining)

    def close(self, timeout: float = 30.0) -> None:
        """Stops the worker after the job in progress (pending jobs are discarded)."""
        with self._cond:
            self._closed = True
            self._pending = None
            self._cond.notify_all()
        self._thread.join(timeout)

    def __enter__(self) -> "AsyncQuantizer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _raise_worker_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"policy quantizer thread failed: {self._error!r}") from self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                weights, version, calib, seq = self._pending
                self._pending = None
            try:
                start = time.perf_counter()
                self._clone.set_weights(weights)
                payload = self.quantizer.quantize(self._clone, version, calib)
                # Report the time from dequeue (set_weights included).
                payload = dataclasses.replace(payload, convert_seconds=time.perf_counter() - start)
            except BaseException as err:  # surfaced to the learner on its next call
                with self._cond:
                    self._error = err
                    self._cond.notify_all()
                return
            with self._cond:
                self._latest = payload
                self._done_seq = seq
                self.completed += 1
                self._cond.notify_all()
