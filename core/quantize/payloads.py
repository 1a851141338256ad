"""PolicyPayload: one policy broadcast, a TFLite flatbuffer at one precision plus small fields.

Plain bytes and numbers (numpy only at import: no TensorFlow), so a payload is
cheap to pickle, scatter to actors or write as a policy file.

Example::

    payload = PolicyQuantizer("int8-dynamic").quantize(q_net, version=7)
    payload.nbytes, payload.describe()["method"]     # flatbuffer size, "convert" or "patch"
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class PolicyPayload:
    """One policy broadcast: plain bytes plus small fields (cheap to pickle/scatter).

    Attributes:
      version: learner policy version.
      precision: one of :data:`PRECISIONS`.
      data: the TFLite flatbuffer.
      convert_seconds: time to produce ``data`` (conversion or patch).
      input_dim, output_dim: observation size and number of outputs.
      method: ``"convert"`` (TFLite converter) or ``"patch"`` (weights written
        into a prebuilt flatbuffer).
    """
    version: int
    precision: str
    data: bytes
    convert_seconds: float
    input_dim: int
    output_dim: int
    method: str = "convert"

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary (no flatbuffer bytes)."""
        return {"version": self.version, "precision": self.precision, "nbytes": self.nbytes,
                "convert_seconds": round(self.convert_seconds, 6), "input_dim": self.input_dim,
                "output_dim": self.output_dim, "method": self.method}

    def __repr__(self) -> str:
        return f"PolicyPayload({self.describe()})"

    @property
    def has_network(self) -> bool:
        """False for :meth:`uniform`'s stand-in: no flatbuffer, its policy outputs zeros."""
        return self.precision != UNIFORM

    @classmethod
    def uniform(cls, version: int, input_dim: int, output_dim: int) -> "PolicyPayload":
        """A stand-in for ``version`` with no network: its policy outputs ``[B, output_dim]`` zeros.

        For actors whose every action is drawn uniformly whatever the policy outputs (epsilon-greedy
        at epsilon >= 1): they act exactly as with ``version`` itself, and nobody waits for
        TensorFlow to convert it (``pipelines.run.policy_versions``, block 0 of a run).
        """
        return cls(int(version), UNIFORM, b"", 0.0, int(input_dim), int(output_dim), "none")


#: The precision of :meth:`PolicyPayload.uniform` (no network; not a broadcast precision).
UNIFORM = "uniform"

