"""MessageChecks: what an actor's ``hello`` and ``step`` messages must hold, checked against the env spec.

The wire format is :mod:`core.inference.protocol`'s; this module says what a
decoded message must contain before the central server
(:mod:`core.inference.server`) acts on it: a ``hello`` names an actor id, a
number of envs and the observation shape and dtype of the server's env; a
``step`` carries ``observation``, ``reward``, ``terminated`` and ``truncated``
of exactly those envs, flags as bool and observations of the spec's dtype
(and, when the server asked for it, ``env_state``: 1-d uint8 JSON text).
Anything else raises :class:`core.inference.protocol.ProtocolError`, one line
naming what is wrong and what is valid; the server aborts that stream with
``INVALID_ARGUMENT``, so nothing the shard writer would refuse reaches an
unroll.

Example::

    checks = MessageChecks(env_spec("CartPole-v1"), max_message_bytes=16 << 20)
    actor_id, num_envs = checks.hello(first_raw_message)
    want = checks.step_shapes(num_envs)                # once per stream
    arrays = checks.step(raw_step_message, want)       # {"observation": [E, 4] float32, ...}
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from core.inference import protocol

#: Most envs one actor stream may step (a bound on what one hello can make the server allocate).
MAX_ENVS = 4096


class MessageChecks:
    """Decodes and validates one server's incoming messages (see module docstring).

    Args:
      spec: the env's :class:`core.envs.EnvSpec`; observations must have its shape and dtype.
      max_message_bytes: larger messages are refused (:func:`core.inference.protocol.decode`).
    """

    def __init__(self, spec, max_message_bytes: int):
        self.spec = spec
        self.max_message_bytes = int(max_message_bytes)
        self._obs_dtype = np.dtype(spec.obs_dtype)     # built once: compared at every step

    def hello(self, raw: bytes) -> Tuple[int, int]:
        """A stream's first message: its ``(actor_id, num_envs)``.

        Raises:
          protocol.ProtocolError: not a hello, fields missing or out of range, or the observation
            shape or dtype differ from the server's env.
        """
        header, _ = protocol.decode(raw, self.max_message_bytes)
        protocol.expect(header, "hello")
        try:
            actor_id, num_envs = int(header["actor_id"]), int(header["num_envs"])
            obs_shape = tuple(int(d) for d in header["obs_shape"])
        except (KeyError, TypeError, ValueError):
            raise protocol.ProtocolError("hello needs integer actor_id, num_envs and an obs_shape list") from None
        if not 1 <= num_envs <= MAX_ENVS or actor_id < 0:
            raise protocol.ProtocolError(f"hello: num_envs={num_envs}, actor_id={actor_id}; "
                                         f"valid: 1 <= num_envs <= {MAX_ENVS}, actor_id >= 0")
        if obs_shape != tuple(self.spec.obs_shape):
            raise protocol.ProtocolError(f"hello: obs_shape {list(obs_shape)} does not match the server's "
                                         f"{list(self.spec.obs_shape)} ({self.spec.env_id})")
        if header.get("obs_dtype") != self.spec.obs_dtype:
            raise protocol.ProtocolError(f"hello: obs_dtype {header.get('obs_dtype')!r} does not match the "
                                         f"server's {self.spec.obs_dtype!r} ({self.spec.env_id})")
        return actor_id, num_envs

    def step_shapes(self, e: int) -> Dict[str, Tuple[int, ...]]:
        """The array shapes a step of ``e`` envs must have (built once per stream)."""
        return {"observation": (e,) + tuple(self.spec.obs_shape), "reward": (e,), "terminated": (e,),
                "truncated": (e,)}

    def step(self, raw: bytes, want: Dict[str, Tuple[int, ...]]) -> Dict[str, np.ndarray]:
        """A step message's arrays, checked against ``want`` (:meth:`step_shapes`) and the spec's dtype.

        Raises:
          protocol.ProtocolError: not a step, an array missing, of another shape, or of another dtype.
        """
        header, arrays = protocol.decode(raw, self.max_message_bytes)
        protocol.expect(header, "step")
        for name, shape in want.items():
            if name not in arrays:
                raise protocol.ProtocolError(f"step message lacks array {name!r}; needs {', '.join(want)}")
            if arrays[name].shape != shape:
                raise protocol.ProtocolError(f"step array {name!r} has shape {list(arrays[name].shape)}, "
                                             f"expected {list(shape)}")
        for name in ("terminated", "truncated"):
            if arrays[name].dtype != np.bool_:
                raise protocol.ProtocolError(f"step array {name!r} must be bool, got {arrays[name].dtype}")
        # Replay shards are typed by the env spec: a stray dtype would fail the shard write (and the run).
        if arrays["observation"].dtype != self._obs_dtype:
            raise protocol.ProtocolError(f"step array 'observation' has dtype {arrays['observation'].dtype}, "
                                         f"expected {self.spec.obs_dtype} ({self.spec.env_id})")
        state = arrays.get("env_state")     # the actor's envs, when the server asked (core.inference.states)
        if state is not None and (state.dtype != np.uint8 or state.ndim != 1):
            raise protocol.ProtocolError(f"step array 'env_state' must be 1-d uint8 (JSON text), got "
                                         f"{state.dtype}{list(state.shape)}")
        return arrays
