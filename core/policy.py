"""The actor-side policy executor: a :class:`PolicyPayload` run by LiteRT.

Actors never import TensorFlow (2-4 s import, 200-300 us per call); they run
the payload's TFLite flatbuffer with ``ai_edge_litert.interpreter.Interpreter``
(1-80 us per call for ActorQ-size MLPs, int8 kernels for int8 payloads; see
shared/PLATFORM_FACTS.md).

Fast path: the interpreter's input is resized to ``batch_size`` once and its
tensors allocated once. A call with exactly ``batch_size`` rows writes into the
input tensor in place, invokes and copies the output out: no reallocation.
Fewer rows are padded into the same tensor (the extra rows are computed and
dropped); more rows run in ``batch_size`` chunks. Use :meth:`resize` if the
actor's batch changes for good.

A payload with no network (:meth:`PolicyPayload.uniform`, a stand-in for
actors that act uniformly) runs no interpreter: its outputs are zeros, and its
:attr:`~LiteRTPolicy.version` is None, so the first real payload replaces it.

Version swaps never stall the actor: :meth:`update` builds and allocates the
new interpreter first, then replaces one reference. A call already running
finishes on the old interpreter. One policy object serves one thread at a
time (LiteRT interpreters are not re-entrant); ``update`` may come from any
thread.

Example::

    policy = LiteRTPolicy(payload, batch_size=8)
    q_values = policy(obs)              # [8, obs_dim] float32 -> [8, num_actions]
    policy.update(newer_payload)        # e.g. from AsyncQuantizer.latest()
"""
from __future__ import annotations

import contextlib
from typing import Optional

import numpy as np

from core import native_logs
from core.quantize import PolicyPayload

#: Whether this process built its first interpreter, at which LiteRT logs its XNNPACK notice (once).
_first_interpreter_built = False


class _Runner:
    """One allocated interpreter for one payload and batch size."""

    def __init__(self, payload: PolicyPayload, batch_size: int, num_threads: int):
        self.payload = payload
        self.batch_size = batch_size
        if not payload.has_network:      # PolicyPayload.uniform: zeros, no interpreter
            self.interpreter = None
            return
        global _first_interpreter_built
        from ai_edge_litert.interpreter import Interpreter
        with contextlib.nullcontext() if _first_interpreter_built else native_logs.notices_dropped():
            self.interpreter = Interpreter(model_content=payload.data, num_threads=num_threads)
            in_detail = self.interpreter.get_input_details()[0]
            out_detail = self.interpreter.get_output_details()[0]
            self.interpreter.resize_tensor_input(in_detail["index"], [batch_size, payload.input_dim],
                                                 strict=False)
            self.interpreter.allocate_tensors()
        _first_interpreter_built = True
        # Callables returning fresh numpy views of the tensors' memory.
        self.input_view = self.interpreter.tensor(in_detail["index"])
        self.output_view = self.interpreter.tensor(out_detail["index"])
        self.input_view()[...] = 0.0

    def run(self, obs: np.ndarray) -> np.ndarray:
        n = obs.shape[0]
        if self.interpreter is None:
            return np.zeros((n, self.payload.output_dim), np.float32)
        if n == self.batch_size:
            self.input_view()[...] = obs
            self.interpreter.invoke()
            return self.output_view().copy()
        if n < self.batch_size:
            self.input_view()[:n] = obs
            self.interpreter.invoke()
            return self.output_view()[:n].copy()
        return np.concatenate([self.run(obs[i:i + self.batch_size])
                               for i in range(0, n, self.batch_size)])


class LiteRTPolicy:
    """Runs a policy payload: ``obs [B, obs_dim] float32 -> [B, output_dim] float32``.

    Args:
      payload: a :class:`core.quantize.PolicyPayload` (any precision).
      batch_size: the batch the interpreter is allocated for (the fast path).
      num_threads: LiteRT CPU threads; 1 by default so actors share cores.
    """

    def __init__(self, payload: PolicyPayload, batch_size: int = 8, num_threads: int = 1):
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.num_threads = int(num_threads)
        self._runner = _Runner(payload, int(batch_size), self.num_threads)

    @property
    def version(self) -> Optional[int]:
        """The payload's version; None for a payload with no network (any real payload replaces it)."""
        payload = self._runner.payload
        return payload.version if payload.has_network else None

    @property
    def precision(self) -> str:
        return self._runner.payload.precision

    @property
    def payload(self) -> PolicyPayload:
        return self._runner.payload

    @property
    def batch_size(self) -> int:
        return self._runner.batch_size

    @property
    def input_dim(self) -> int:
        return self._runner.payload.input_dim

    @property
    def output_dim(self) -> int:
        return self._runner.payload.output_dim

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        runner = self._runner  # one read: an update() mid-call cannot mix versions
        obs = np.asarray(obs, dtype=np.float32)
        if obs.ndim != 2 or obs.shape[1] != runner.payload.input_dim:
            raise ValueError(f"policy expects observations [B, {runner.payload.input_dim}], "
                             f"got shape {obs.shape}")
        return runner.run(obs)

    def update(self, payload: PolicyPayload) -> bool:
        """Switches to ``payload``; returns False if it is the payload already in use.

        The new interpreter is built and allocated before the swap, so actors
        keep acting on the old version meanwhile. Any version is accepted (a
        resumed run may roll back); callers that want monotonic versions
        compare ``payload.version`` with :attr:`version` first.
        """
        current = self._runner
        if payload is current.payload:
            return False
        if (payload.input_dim, payload.output_dim) != (current.payload.input_dim,
                                                       current.payload.output_dim):
            raise ValueError(f"payload dims {payload.input_dim}->{payload.output_dim} differ from "
                             f"the policy's {current.payload.input_dim}->{current.payload.output_dim}")
        self._runner = _Runner(payload, current.batch_size, self.num_threads)
        return True

    def resize(self, batch_size: int) -> None:
        """Reallocates the interpreter for a new fixed batch size."""
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._runner = _Runner(self._runner.payload, int(batch_size), self.num_threads)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Argmax actions ``[B]`` int64 (discrete policies)."""
        return np.argmax(self(obs), axis=-1)
