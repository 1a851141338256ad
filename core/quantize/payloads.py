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

