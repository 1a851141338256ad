"""Wire format of the inference stream: one bytes message = header + numpy arrays.

    message := u32 little-endian header length | header (UTF-8 JSON) | array bytes...
    header  := {"kind": str, ..., "arrays": [[name, dtype, shape], ...]}

Arrays follow the header back to back, C-contiguous, in the listed order.

Framing copies each array once and never again: :func:`encode` joins the
arrays' own buffers straight into the one ``bytes`` gRPC sends (no
``tobytes()`` intermediate), and :func:`decode` returns read-only numpy
*views* of the received message (``np.frombuffer``), so the observations the
server batches are the bytes that came off the wire.
Only plain numeric/bool dtypes are accepted (nothing is ever unpickled), and
every size is checked against the message length, so a malformed or
truncated message raises :class:`ProtocolError` with a one-line reason.

gRPC carries these as raw bytes through generic handlers
(``request_deserializer=None``): no protoc codegen and no custom TF ops.

Stream conversation (one bidi stream per env-only actor)::

    actor -> hello   {actor_id, num_envs, env_id, obs_shape, obs_dtype}
    server-> welcome {connection, task, incarnation}   (a fresh connection = fresh envs, seeded for the
                                                  actor's next unfinished task; SEED's run_id)
    actor -> step    obs[E, ...], reward[E] f32, terminated[E] bool, truncated[E] bool
    server-> actions action[E] i64, {stop}        (stop=True: the run is over, or a newer connection of
                                                  this actor replaced the stream: close it)
    ... step/actions repeat ...

    (resume, core.inference.states) welcome may carry env_state u8 (a stored actor's envs); actions may
    carry {state: k} (a plan block ends): the next step then carries env_state u8, the envs before task k

``reward`` is the reward of the previous action; ``terminated``/``truncated``
flag the observation they come with (RLDS rows, :mod:`core.trajectory`).
"""
from __future__ import annotations

import json
import struct
from typing import Any, Dict, Tuple

import numpy as np

SERVICE = "databloom.Inference"
METHOD = f"/{SERVICE}/Act"
#: dtypes allowed on the wire (no object dtype: nothing is unpickled)
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
MAX_HEADER_BYTES = 64 << 10
_LEN = struct.Struct("<I")


class ProtocolError(ValueError):
    """A malformed, oversized or unexpected message (one-line reason)."""


def encode(header: Dict[str, Any], arrays: Dict[str, np.ndarray] | None = None) -> bytes:
    """Serialize ``header`` and ``arrays`` (see module docstring)."""
    # asarray(order="C"), not ascontiguousarray: that one turns a 0-d array into shape (1,).
    arrays = {k: np.asarray(v, order="C") for k, v in (arrays or {}).items()}
    meta = dict(header, arrays=[[k, v.dtype.name, list(v.shape)] for k, v in arrays.items()])
    head = json.dumps(meta, separators=(",", ":")).encode()
    # A flat uint8 view exposes each array's own buffer: join copies it once, into the message.
    return b"".join([_LEN.pack(len(head)), head] + [v.reshape(-1).view(np.uint8) for v in arrays.values()])


def decode(data: bytes, max_bytes: int = 64 << 20) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """Parse a message; raises :class:`ProtocolError` on anything malformed or oversized."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"message must be bytes, got {type(data).__name__}")
    n = len(data)
    if n > max_bytes:
        raise ProtocolError(f"message of {n} bytes exceeds the limit of {max_bytes} bytes")
    if n < _LEN.size:
        raise ProtocolError(f"message of {n} bytes is shorter than its length prefix")
    (hlen,) = _LEN.unpack_from(data, 0)
    if hlen > MAX_HEADER_BYTES or _LEN.size + hlen > n:
        raise ProtocolError(f"header length {hlen} is invalid for a {n}-byte message")
    try:
        header = json.loads(bytes(data[_LEN.size:_LEN.size + hlen]).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"header is not valid JSON: {e.msg if hasattr(e, 'msg') else e}") from None
    if not isinstance(header, dict) or not isinstance(header.get("kind"), str):
        raise ProtocolError("header must be a JSON object with a string 'kind'")
    specs = header.pop("arrays", [])
    if not isinstance(specs, list):
        raise ProtocolError("header 'arrays' must be a list of [name, dtype, shape]")
    arrays: Dict[str, np.ndarray] = {}
    offset = _LEN.size + hlen
    for spec in specs:
        try:
            name, dtype, shape = spec
            shape = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise ProtocolError(f"array spec {spec!r} must be [name, dtype, shape]") from None
        if dtype not in DTYPES:
            raise ProtocolError(f"array {name!r} has dtype {dtype!r}; valid: {', '.join(DTYPES)}")
        if any(d < 0 for d in shape):
            raise ProtocolError(f"array {name!r} has a negative dimension in {shape}")
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if offset + size > n:
            raise ProtocolError(f"array {name!r} {dtype}{list(shape)} needs {size} bytes; "
                                f"only {n - offset} left in the message")
        arrays[str(name)] = np.frombuffer(data, dtype=dtype, count=size // np.dtype(dtype).itemsize,
                                          offset=offset).reshape(shape)
        offset += size
    if offset != n:
        raise ProtocolError(f"message has {n - offset} trailing bytes after its arrays")
    return header, arrays


def expect(header: Dict[str, Any], kind: str) -> None:
    """Raises :class:`ProtocolError` unless ``header`` is a ``kind`` message."""
    if header.get("kind") != kind:
        raise ProtocolError(f"expected a {kind!r} message, got {header.get('kind')!r}")
