"""A central actor's state at a task boundary, joined into (and split from) a local actor's document.

In central mode an actor's state lives in two processes. The env-only actor
(:mod:`core.inference.client`) holds the envs; the server holds, per
connection, the episode bookkeeping (:class:`~core.inference.unrolls.UnrollAssembler`),
the frame stack and the recurrent carry, and sees each step's observations
and flags. A local actor (:class:`core.actor.ActorState`) holds all of it.
This module joins the halves into the local actor's :mod:`core.actor_state`
document, so a central run's shards hold the very document a local run's
hold (``pipelines.run.resume`` reads and validates either), and splits a stored
document back into the halves at ``--resume``::

    capture, the step that opens task k after task k-1 ended a plan block:
        server -> actions {state: k}                  (the reply to task k-1's last step)
        actor  -> step + env_state = actor_half(spec, k, envs)
        server -> join(...) -> the local actor's document before task k (RolloutResult.actor_state)
    resume, a connection whose next unfinished task is the stored document's:
        trainer -> ResumePoint.from_document(spec, doc)   (bookkeeping, frames, carry; the actor's half)
        server  -> welcome + env_state; actor -> restore_actor_half(spec, bytes) -> envs, obs, flags

Envs whose state is not data (``ActorStateUnsupported``: Atari, dm_control)
send ``{"unsupported": reason}`` as their half, and the shard stores that, as
a local actor's would: such a resume is fault-tolerant but not bit-identical.
"""
from __future__ import annotations

import copy
import types
from typing import Any, Dict, Optional, Tuple

import numpy as np

from core.inference.protocol import ProtocolError

#: Fields of a local actor's document the env-only actor holds (all others are the server's).
ACTOR_FIELDS = ("envs", "obs", "obs_terminated", "obs_truncated")
#: Episode bookkeeping, named as in both core.actor.ActorState and UnrollAssembler.
BOOKKEEPING = ("streams", "episode_id", "step", "started_in_task", "counted_task", "episode_return")


def actor_half(spec, task: int, envs) -> bytes:
    """The env-only actor's envs before ``task``, as UTF-8 JSON (the step's ``env_state`` array)."""
    from core.actor_state import ActorStateUnsupported, capture, dumps
    try:
        doc = capture(types.SimpleNamespace(spec=spec, next_task=int(task), envs=envs))
    except ActorStateUnsupported as e:
        doc = {"unsupported": str(e)}
    return dumps(doc).encode()


def restore_actor_half(spec, data: bytes) -> Tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
    """``(envs, obs, terminated, truncated)`` from the welcome's ``env_state`` (a resumed actor)."""
    from core.actor_state import loads, restore
    state = restore(spec, loads(bytes(data).decode()))
    return state.envs, state.obs, state.obs_terminated, state.obs_truncated


def join(env_id: str, task: int, unrolls, stacker, carry, obs: np.ndarray, terminated: np.ndarray,
         truncated: np.ndarray, half: bytes) -> Dict[str, Any]:
    """The local actor's document before ``task`` (see module docstring).

    Args:
      unrolls: the connection's assembler, right after it completed task ``task - 1``'s last row.
      stacker, carry: the connection's frame stack (``FrameStacker``) and recurrent carry (or None).
      obs, terminated, truncated: the step message that opens the next task.
      half: the actor's ``env_state`` bytes (:func:`actor_half`).

    Raises:
      ProtocolError: the actor's half is not a document of this actor, envs and task.
    """
    import json
    from core.actor_state import MAX_DOC_BYTES, ActorStateError, capture, loads
    e = unrolls.num_envs
    try:
        text = bytes(half).decode()
        raw = json.loads(text) if len(text) <= MAX_DOC_BYTES else None
    except (ValueError, UnicodeDecodeError) as err:
        raise ProtocolError(f"env_state: not JSON ({err})") from None
    if isinstance(raw, dict) and set(raw) == {"unsupported"}:    # Atari, dm_control: not data (actor_half)
        return {"unsupported": str(raw["unsupported"])}
    try:
        client = loads(text)
    except ActorStateError as err:
        raise ProtocolError(f"env_state: {err}") from None
    want = {"env_id": env_id, "actor": unrolls.actor_id, "num_envs": e, "task": task}
    if any(client.get(k) != v for k, v in want.items()) or "envs" not in client.get("state", {}):
        raise ProtocolError(f"env_state of actor {client.get('actor')!r} task {client.get('task')!r} is not "
                            f"the envs of actor {unrolls.actor_id} before task {task}")
    fields = {k: getattr(unrolls, k) for k in BOOKKEEPING}
    if fields["counted_task"] != task - 1:      # a local actor recounts at every task's start (core.rollout)
        fields["counted_task"], fields["started_in_task"] = task - 1, np.zeros(e, np.int64)
    new = unrolls.new_episode()
    state = types.SimpleNamespace(
        spec=types.SimpleNamespace(env_id=env_id, actor_id=unrolls.actor_id, num_envs=e), next_task=task,
        **fields, obs=np.array(obs), obs_terminated=np.where(new, False, terminated),
        obs_truncated=np.where(new, False, truncated), carry=carry, has_carry=True,
        stacker=stacker if stacker.k > 1 else None)   # a local actor stacks only k > 1
    doc = capture(state)
    doc["state"] = dict(sorted({**doc["state"], "envs": client["state"]["envs"]}.items()))
    return doc


class ResumePoint:
    """A stored actor state split for a resumed connection: the server's half decoded, the actor's as bytes.

    Args (:meth:`from_document`): the actor's :class:`core.actor.ActorSpec` and its stored document.
    """

    def __init__(self, task: int, bookkeeping: Dict[str, Any], frames: Optional[np.ndarray], carry,
                 actor_bytes: bytes):
        self.task, self.bookkeeping, self.frames, self.carry = int(task), bookkeeping, frames, carry
        self.actor_bytes = actor_bytes

    @classmethod
    def from_document(cls, spec, doc: Dict[str, Any]) -> "ResumePoint":
        from core.actor_state import dumps, restore
        server = {k: v for k, v in doc["state"].items() if k not in ACTOR_FIELDS}
        state = restore(spec, {**doc, "state": server})
        state.envs.close()          # the actor's envs are the env-only actor's to restore
        actor = {**doc, "state": {k: v for k, v in doc["state"].items() if k in ACTOR_FIELDS}}
        frames = state.stacker.frames if state.stacker is not None else None
        return cls(doc["task"], {k: getattr(state, k) for k in BOOKKEEPING}, frames, state.carry,
                   dumps(actor).encode())

    def server_half(self) -> Tuple[Dict[str, Any], Optional[np.ndarray], Any]:
        """Fresh copies of ``(bookkeeping, frames, carry)`` for one connection (a reconnect gets them again)."""
        return copy.deepcopy(self.bookkeeping), copy.deepcopy(self.frames), copy.deepcopy(self.carry)
