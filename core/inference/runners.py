"""Inference runners: the one interface the central server runs its policy through.

The server (:mod:`core.inference.server`) only ever calls an
:class:`InferenceRunner`: ``runner(x [B, input_dim] float32) -> [B, output_dim]``,
``runner.update(payload)`` and ``runner.version``. Everything about *where*
the network runs (LiteRT on this CPU today; a TF/JAX runner on an
accelerator would be one more class here) stays behind it. The batcher
makes one call at a time (under its lock), so runners need not be re-entrant.

:class:`LiteRTRunner` runs a :class:`core.quantize.PolicyPayload` with LiteRT
(fp32 or int8) and picks its **rows per call** by measurement, because a
bigger call is not always cheaper per row on a CPU: the Nature CNN at fp32
costs 0.09 ms/row at 16 rows and 0.33 ms/row at 32 on this machine (the
activations of 32 stacked-frame inputs no longer fit in cache). At start the
runner times one call at each power of two up to ``max_batch_size`` and
keeps the size with the lowest time per row (:func:`best_chunk`); a batch is
then run in calls of that many rows, and a shorter remainder on the smallest
power-of-two interpreter that holds it (so a 16-row request never pays for
32 padded rows, as a single interpreter allocated at the maximum would).

Example::

    runner = LiteRTRunner(payload, max_batch_size=32)     # calibrates: runner.chunk_rows, runner.calibration
    logits = runner(obs_rows)                             # [B, output_dim]
    runner.update(newer_payload)                          # next calls use it
"""
from __future__ import annotations

import time
from typing import Dict, Optional, Protocol

import numpy as np


class InferenceRunner(Protocol):
    """What the server needs from whatever runs the network (see module docstring)."""

    @property
    def version(self) -> int:
        """The policy version the next call runs."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``[B, input_dim]`` float32 rows -> ``[B, output_dim]`` float32."""

    def update(self, payload) -> bool:
        """Run ``payload`` from the next call on; False if it is already in use."""


def power_of_two_sizes(max_batch_size: int):
    """``1, 2, 4, ...`` up to and including ``max_batch_size`` (which need not be a power of two)."""
    sizes, s = [], 1
    while s < max_batch_size:
        sizes.append(s)
        s *= 2
    return sizes + [int(max_batch_size)]


def best_chunk(ms_per_call: Dict[int, float]) -> int:
    """The rows per call with the lowest time per row; ties go to the larger call (fewer calls).

    >>> best_chunk({1: 0.12, 16: 1.45, 32: 10.6})
    16
    """
    return min(ms_per_call, key=lambda n: (ms_per_call[n] / n, -n))


class LiteRTRunner:
    """LiteRT fp32/int8 on this CPU, in calls of the measured best size (see module docstring).

    Args:
      payload: the first :class:`core.quantize.PolicyPayload`.
      max_batch_size: the most rows one batch can hold.
      num_threads: LiteRT CPU threads per interpreter.
      chunk_rows: rows per call; None measures it (:func:`best_chunk` over powers of two).
      calibration_reps: timed calls per size when measuring.
    """

    def __init__(self, payload, max_batch_size: int, num_threads: int = 1, chunk_rows: Optional[int] = None,
                 calibration_reps: int = 5):
        if max_batch_size < 1 or (chunk_rows is not None and not 1 <= chunk_rows <= max_batch_size):
            raise ValueError(f"max_batch_size={max_batch_size}, chunk_rows={chunk_rows}; "
                             f"valid: max_batch_size >= 1, 1 <= chunk_rows <= max_batch_size")
        self.max_batch_size, self.num_threads = int(max_batch_size), int(num_threads)
        self._payload = payload
        self._policies: Dict[int, object] = {}
        self.calibration: Dict[int, float] = {}           # rows -> median ms per call (measured sizes)
        self.chunk_rows = int(chunk_rows) if chunk_rows else self._calibrate(calibration_reps)

    @property
    def version(self) -> int:
        return self._payload.version

    @property
    def precision(self) -> str:
        return self._payload.precision

    def _policy(self, rows: int):
        """The interpreter allocated for exactly ``rows`` rows (built on first use, kept)."""
        policy = self._policies.get(rows)
        if policy is None:
            from core.policy import LiteRTPolicy
            policy = self._policies[rows] = LiteRTPolicy(self._payload, batch_size=rows,
                                                         num_threads=self.num_threads)
        return policy

    def _calibrate(self, reps: int) -> int:
        x = np.zeros((self.max_batch_size, self._payload.input_dim), np.float32)
        for n in power_of_two_sizes(self.max_batch_size):
            policy = self._policy(n)
            policy(x[:n])                                   # first call: lazy kernel set-up
            times = []
            for _ in range(max(int(reps), 1)):
                t0 = time.perf_counter()
                policy(x[:n])
                times.append(time.perf_counter() - t0)
            self.calibration[n] = 1e3 * float(np.median(times))
        return best_chunk(self.calibration)

    def _tail_size(self, rows: int) -> int:
        """The smallest power-of-two interpreter (capped at the chunk) that holds ``rows``."""
        return min(s for s in power_of_two_sizes(self.chunk_rows) if s >= rows)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        n, chunk = len(x), self.chunk_rows
        if n <= chunk:
            return self._policy(self._tail_size(n))(x)
        full = (n // chunk) * chunk
        outs = [self._policy(chunk)(x[:full])]              # LiteRTPolicy runs > batch_size rows in chunks
        if full < n:
            outs.append(self._policy(self._tail_size(n - full))(x[full:]))
        return np.concatenate(outs)

    def update(self, payload) -> bool:
        if payload is self._payload:
            return False
        for policy in self._policies.values():
            policy.update(payload)                          # builds the new interpreter before the swap
        self._payload = payload
        return True
