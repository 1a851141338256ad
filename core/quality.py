"""Per-broadcast policy quality: how a quantized payload acts compared with fp32.

For every broadcast the driver measures, on one **fixed probe batch** of
replay observations (drawn once, with a fixed seed, as soon as replay holds
enough rows, so every version is scored on the same inputs):

* ``action_agreement`` (:func:`core.quantize.action_agreement`): for discrete
  policies the fraction of probe rows whose argmax action equals fp32's
  (1.0 = identical); for continuous ones the mean absolute difference of the
  policy outputs, in the policy's own units (tanh outputs in [-1, 1] for
  D4PG; 0.0 = identical);
* ``weight_quant_error`` (:func:`core.quantize.weight_quantization_error`):
  per dense layer, ``||W - dq(q(W))||_2 / ||W||_2`` under the payloads'
  per-channel symmetric int8 rule (``scale_c = max_i |w_ci| / 127``), for
  the parameters of the version that was broadcast.

The fp32 reference is a private clone of the policy network loaded with the
broadcast version's parameters, so async quantization (the learner has moved
on meanwhile) is scored against the right weights. Cost for ActorQ's 3x2048
MLP: tens of milliseconds per broadcast (see ``seconds`` in each record).

The work runs in one background thread (:meth:`submit` / :meth:`collect`):
the int8 weight-error pass alone takes ~0.4 s for a 3x2048 MLP, which
would otherwise stall the learner at every broadcast. Versions are scored
in order; if scoring falls behind, intermediate versions are skipped (each
record names its version).

Example::

    probe = BroadcastQualityProbe(discrete=False, size=256, seed=0)
    metrics = probe.measure(payload, params, policy_model, sampler, cache)   # synchronous
    metrics["action_agreement"], metrics["weight_quant_error"]["dense_0"]
    probe.submit(payload, params, policy_model, sampler, cache)              # background
    for record in probe.collect():   # finished ones, e.g. logged as "broadcast_quality"
        ...
"""
from __future__ import annotations

import time
from typing import Any, Dict, Optional

import numpy as np


class BroadcastQualityProbe:
    """Scores payloads against fp32 on a fixed probe batch (see module docstring)."""

    def __init__(self, discrete: bool, size: int = 256, seed: int = 0):
        self.discrete, self.size, self.seed = bool(discrete), int(size), int(seed)
        self.probe: Optional[np.ndarray] = None
        self._clone = None
        self._policy = None

    def submit(self, payload, params, policy_model, sampler=None, cache=None) -> None:
        """Score ``payload`` in the background (skipped while a previous one is still running)."""
        import concurrent.futures
        if params is None or not self._ensure_probe(sampler, cache, payload.input_dim):
            return
        if getattr(self, "_pool", None) is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="quality")
            self._futures = []
        if any(not f.done() for f in self._futures):
            return
        self._futures.append(self._pool.submit(self.measure, payload, params, policy_model))

    def collect(self, wait: bool = False) -> list:
        """Finished results (dicts with ``version``), oldest first; ``wait`` drains all."""
        futures = getattr(self, "_futures", [])
        done = [f for f in futures if wait or f.done()]
        self._futures = [f for f in futures if f not in done]
        out = []
        for f in done:
            try:
                out.append(f.result())
            except Exception as e:  # a metric must never end a run
                out.append({"error": f"{type(e).__name__}: {e}"})
        return out

    def close(self) -> None:
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _ensure_probe(self, sampler, cache, input_dim: Optional[int] = None) -> bool:
        """Fix the probe: ``size`` random committed rows of the cache (any sampler kind).

        Rows come straight from the cache, so sequence samplers (V-trace,
        R2D2) probe single steps too. A recurrent policy (input ``[obs, h, c]``,
        see ``core.agents.r2d2.actor.LSTMCarry``) is probed at the recurrent
        state its actor stored with each row (``extras/lstm_h``, ``extras/lstm_c``).
        """
        if self.probe is None and cache is not None and cache.size >= self.size:
            alive = np.flatnonzero(cache.alive)
            rows = np.sort(np.random.default_rng([self.seed, 4242]).choice(alive, self.size, replace=False))
            parts = [cache.data["observation"][rows].reshape(self.size, -1)]
            if input_dim is not None and input_dim != parts[0].shape[1]:
                state = [f for f in ("extras/lstm_h", "extras/lstm_c") if f in cache.data]
                parts += [cache.data[f][rows].reshape(self.size, -1) for f in state]
            probe = np.ascontiguousarray(np.concatenate(parts, axis=1), np.float32)
            if input_dim is not None and probe.shape[1] != input_dim:
                return False   # a policy input this probe cannot build: no quality metrics
            self.probe = probe
        return self.probe is not None

    def measure(self, payload, params: Optional[Dict[str, np.ndarray]], policy_model, sampler=None,
                cache=None) -> Dict[str, Any]:
        """Quality metrics for ``payload`` (empty dict until the probe batch exists)."""
        if params is None or not self._ensure_probe(sampler, cache, payload.input_dim):
            return {}
        import keras
        from core.policy import LiteRTPolicy
        from core.quantize import action_agreement, weight_quantization_error
        t0 = time.perf_counter()
        if self._clone is None:
            self._clone = keras.models.clone_model(policy_model)
        self._clone.set_weights(list(params.values()) if isinstance(params, dict) else list(params))
        reference = np.asarray(self._clone(self.probe))
        if self._policy is None:
            self._policy = LiteRTPolicy(payload, batch_size=len(self.probe))
        else:
            self._policy.update(payload)
        quantized = self._policy(self.probe)
        errors = weight_quantization_error(self._clone)
        return {"version": int(payload.version), "precision": payload.precision,
                "action_agreement": action_agreement(reference, quantized, discrete=self.discrete),
                "agreement_kind": "argmax_match" if self.discrete else "mean_abs_action_diff",
                "weight_quant_error": errors, "weight_quant_error_max": max(errors.values(), default=0.0),
                "probe_size": len(self.probe), "quality_seconds": time.perf_counter() - t0}
