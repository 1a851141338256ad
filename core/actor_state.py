"""An actor's env state as a data document that may be stored: JSON, no pickle.

A run that is resumed, or a Beam round that continues the previous round's
actors, needs each actor's state after its last task: the envs (physics
state, step counters, RNG states of env and spaces), the observations and
episode bookkeeping of :class:`core.actor.ActorState`, the recurrent carry
and the frame stack. :func:`capture` turns that state into a JSON-able
document; :func:`restore` builds the actor fresh from seeds (trusted code
decides the type of every object) and then only *assigns stored data* into
it, checking at every step that the stored structure matches the fresh one::

    doc = capture(state)                 # {"format", "env_id", "actor", "task", "num_envs", "state"}
    text = dumps(doc)                    # compact JSON; arrays as base64 of their raw bytes
    state = restore(spec, loads(text))   # positioned at doc["task"]; steps bit-identically

Leaves are ``None``, ``bool``, ``int``, ``float``, ``str``, numpy scalars,
numeric/bool numpy arrays (``{"__nd__": [dtype, shape, base64]}``) and
numpy ``Generator``s (``{"__rng__": bit_generator.state}``) and numeric dtypes; lists, tuples
and string-keyed dicts of them; and the attributes of objects defined in
``gymnasium`` or ``core`` (``{"__obj__": class, "attrs": {...}}``). Not
captured, because the fresh actor has them already: functions held by such
objects (an observation transform's lambda) and gymnasium spaces (static
bounds; their RNG serves only ``.sample()``, which actors never call), so
two captures of one state are the same document. Object
types are never created from the document, with one allowlisted exception:
the recurrent carries of :data:`core.exploration.CARRIES` (a fresh actor
makes its carry only when its first policy arrives). Anything else (an
emulator handle of Atari's ALE, MuJoCo physics of dm_control) makes
:func:`capture` raise :class:`ActorStateUnsupported`: such envs are
fault-tolerant but not bit-identical across a resume.

Cost: capturing 8 CartPole envs takes about 0.4 ms and ~13 KB of JSON
(``python -m core.actor_state``, measured on the 2-core dev VM).
"""
from __future__ import annotations

import base64
import enum
import functools
import json
import types
from typing import Any, Dict, Optional

import gymnasium
import numpy as np

FORMAT = "databloom.actor_state/1"

#: ``ActorState`` fields that are not data: rebuilt by the fresh actor (or checked apart, ``spec``).
_ACTOR_SKIP = frozenset({"spec", "policy", "lock", "select", "env_spec"})
#: Attributes never captured anywhere: closures that build envs, registration specs, render handles.
_SKIP = frozenset({"env_fns", "spec", "_cached_spec", "_saved_kwargs", "render_mode", "screen", "clock",
                   "_metadata"})
#: Not state: code the fresh actor has too (an observation transform's lambda, say), and gymnasium
#: spaces (bounds and shapes are static; their RNG serves only ``.sample()``, which actors never call,
#: and an unseeded one would make two captures of one state differ).
_STATIC = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial,
           gymnasium.spaces.Space)
#: Module prefixes whose objects are walked attribute by attribute.
_WALKED = ("gymnasium.", "core.")
#: Largest document :func:`loads` accepts (a stored document is data from disk: bounded).
MAX_DOC_BYTES = 64 << 20


class ActorStateError(ValueError):
    """A stored actor state that does not fit the actor it is restored into (one-line message)."""


class ActorStateUnsupported(ActorStateError):
    """The actor's envs hold state that is not data (an emulator or physics handle)."""


# --------------------------------------------------------------------------- capture
def capture(state) -> Dict[str, Any]:
    """``state`` (a :class:`core.actor.ActorState` between tasks) as a JSON-able document."""
    spec = state.spec
    fields = {k: _encode(v, k) for k, v in sorted(state.__dict__.items()) if k not in _ACTOR_SKIP}
    return {"format": FORMAT, "env_id": spec.env_id, "actor": int(spec.actor_id), "task": int(state.next_task),
            "num_envs": int(spec.num_envs), "state": fields}


def _qualname(obj) -> str:
    t = type(obj)
    return f"{t.__module__}:{t.__qualname__}"


def _encode(v, path: str):
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, np.generic):        # before int/float: np.float64 subclasses float (keep its type)
        return _encode(np.asarray(v), path) | {"__scalar__": True}
    if isinstance(v, (int, float)) and not isinstance(v, enum.Enum):
        return {"__float__": repr(v)} if isinstance(v, float) and not np.isfinite(v) else v
    if isinstance(v, np.ndarray):
        if v.dtype.kind not in "biuf":
            raise ActorStateUnsupported(f"{path}: a {v.dtype} array is not data")
        a = np.ascontiguousarray(v)
        return {"__nd__": [a.dtype.str, list(a.shape), base64.b64encode(a.tobytes()).decode("ascii")]}
    if isinstance(v, np.random.Generator):
        return {"__rng__": v.bit_generator.state}
    if isinstance(v, np.dtype):
        if v.kind not in "biuf":
            raise ActorStateUnsupported(f"{path}: dtype {v} is not data")
        return {"__dtype__": v.str}
    if isinstance(v, enum.Enum):
        return {"__enum__": v.name}
    if isinstance(v, (list, tuple)):
        items = [_encode(x, f"{path}[{i}]") for i, x in enumerate(v)]
        return {"__tuple__": items} if isinstance(v, tuple) else items
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v):
            raise ActorStateUnsupported(f"{path}: a dict with non-string keys")
        return {"__dict__": {k: _encode(x, f"{path}.{k}") for k, x in v.items()}}
    if callable(v) and not hasattr(v, "__dict__"):
        raise ActorStateUnsupported(f"{path}: {_qualname(v)} is not data")
    if type(v).__module__.startswith(_WALKED) and hasattr(v, "__dict__"):
        return {"__obj__": _qualname(v), "attrs": {k: _encode(x, f"{path}.{k}") for k, x in v.__dict__.items()
                                                   if k not in _SKIP and not isinstance(x, _STATIC)}}
    raise ActorStateUnsupported(f"{path}: {_qualname(v)} is not data")


# --------------------------------------------------------------------------- restore
def restore(spec, doc: Dict[str, Any]):
    """A new :class:`core.actor.ActorState` for ``spec`` holding ``doc``'s state (module docstring)."""
    from core.actor import ActorState
    _check_header(spec, doc)
    state = ActorState(spec, int(doc["task"]))
    for name, value in doc["state"].items():
        if name in _ACTOR_SKIP or not _assignable(state, name):
            raise ActorStateError(f"actor state field {name!r} may not be restored")
        if name == "carry" and isinstance(value, dict) and "__obj__" in value and state.carry is None:
            state.carry = _new_carry(value["__obj__"], value)
            continue
        setattr(state, name, _apply(getattr(state, name, None), value, name))
    if getattr(state, "carry", None) is not None:
        state.has_carry = True     # set_policy must not replace the restored carry
    return state


def _check_header(spec, doc) -> None:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ActorStateError(f"not an actor state document (format {doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r}; valid: {FORMAT})")
    want = {"env_id": spec.env_id, "actor": int(spec.actor_id), "num_envs": int(spec.num_envs)}
    for key, value in want.items():
        if doc.get(key) != value:
            raise ActorStateError(f"actor state {key} {doc.get(key)!r} does not match the run's {value!r}")
    if not isinstance(doc.get("task"), int) or doc["task"] < 0 or not isinstance(doc.get("state"), dict):
        raise ActorStateError(f"actor state of actor {spec.actor_id}: bad task {doc.get('task')!r} or state")


def _new_carry(qualname: str, value: Dict[str, Any]):
    """A recurrent carry of an allowlisted class holding ``value``'s data attributes."""
    import importlib
    from core.exploration import CARRIES
    allowed = set(CARRIES.values())
    if qualname not in allowed:
        raise ActorStateError(f"actor state carry {qualname!r} is not a known recurrent carry ({sorted(allowed)})")
    module, name = qualname.split(":")
    cls = getattr(importlib.import_module(module), name)
    carry = cls.__new__(cls)
    attrs = value.get("attrs")
    if not isinstance(attrs, dict):
        raise ActorStateError("actor state carry: bad attrs")
    for k, v in attrs.items():
        if k.startswith("__") or hasattr(cls, k):
            raise ActorStateError(f"actor state carry.{k} may not be restored")
        setattr(carry, k, _apply(None, v, f"carry.{k}"))
    return carry


#: Attributes an actor gains after it is built (set by its first task).
_LATE = frozenset({"has_carry"})


def _assignable(obj, name: str) -> bool:
    """Stored data may set the attributes a fresh object has (never a new one, a method or a property)."""
    return not name.startswith("__") and (name in obj.__dict__ or (name in _LATE and not hasattr(type(obj), name)))


def _apply(current, value, path: str):
    """``value`` decoded and assigned into ``current`` (objects in place); returns the new value."""
    if isinstance(value, dict) and "__obj__" in value:
        if current is None or not hasattr(current, "__dict__") or _qualname(current) != value["__obj__"]:
            raise ActorStateError(f"actor state {path}: stored {value['__obj__']}, the actor has "
                                  f"{_qualname(current) if current is not None else None}")
        attrs = value.get("attrs")
        if not isinstance(attrs, dict):
            raise ActorStateError(f"actor state {path}: bad attrs")
        for k, v in attrs.items():
            if k in _SKIP or not _assignable(current, k):
                raise ActorStateError(f"actor state {path}.{k} may not be restored")
            setattr(current, k, _apply(getattr(current, k, None), v, f"{path}.{k}"))
        return current
    if isinstance(value, dict) and "__rng__" in value:
        if not isinstance(current, np.random.Generator):
            raise ActorStateError(f"actor state {path}: stored an RNG, the actor has {type(current).__name__}")
        try:
            current.bit_generator.state = value["__rng__"]
        except (TypeError, ValueError, KeyError) as e:
            raise ActorStateError(f"actor state {path}: bad RNG state ({e})") from None
        return current
    if isinstance(value, dict) and "__enum__" in value:
        if not isinstance(current, enum.Enum) or current.name != value["__enum__"]:
            raise ActorStateError(f"actor state {path}: stored {value['__enum__']}, the actor has {current!r}")
        return current
    if isinstance(value, list):
        if isinstance(current, list) and len(current) == len(value) and any(hasattr(c, "__dict__") for c in current):
            return [_apply(c, v, f"{path}[{i}]") for i, (c, v) in enumerate(zip(current, value))]
        return [_apply(None, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict) and "__tuple__" in value:
        items, cur = value["__tuple__"], current if isinstance(current, tuple) else ()
        return tuple(_apply(cur[i] if i < len(cur) else None, v, f"{path}[{i}]") for i, v in enumerate(items))
    if isinstance(value, dict) and "__dict__" in value:
        cur = current if isinstance(current, dict) else {}
        return {k: _apply(cur.get(k), v, f"{path}.{k}") for k, v in value["__dict__"].items()}
    if isinstance(value, dict) and "__nd__" in value:
        return _decode_array(value, path)
    if isinstance(value, dict) and "__dtype__" in value:
        try:
            dtype = np.dtype(value["__dtype__"])
        except TypeError as e:
            raise ActorStateError(f"actor state {path}: bad dtype ({e})") from None
        if dtype.kind not in "biuf":
            raise ActorStateError(f"actor state {path}: dtype {dtype} is not numeric")
        return dtype
    if isinstance(value, dict) and "__float__" in value:
        if value["__float__"] not in ("inf", "-inf", "nan"):
            raise ActorStateError(f"actor state {path}: bad float {value['__float__']!r}")
        return float(value["__float__"])
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ActorStateError(f"actor state {path}: unreadable value of type {type(value).__name__}")


def _decode_array(value: Dict[str, Any], path: str):
    try:
        dtype_str, shape, data = value["__nd__"]
        dtype = np.dtype(dtype_str)
        shape = tuple(int(s) for s in shape)
        raw = base64.b64decode(data, validate=True)
    except (TypeError, ValueError, KeyError) as e:
        raise ActorStateError(f"actor state {path}: bad array ({e})") from None
    if dtype.kind not in "biuf" or any(s < 0 for s in shape) or len(raw) != dtype.itemsize * int(np.prod(shape)):
        raise ActorStateError(f"actor state {path}: array of {dtype} {shape} does not match its {len(raw)} bytes")
    a = np.frombuffer(raw, dtype).reshape(shape).copy()
    return a[()] if value.get("__scalar__") else a


# --------------------------------------------------------------------------- text
def dumps(doc: Dict[str, Any]) -> str:
    """Compact JSON text of a document."""
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)


def loads(text: str) -> Dict[str, Any]:
    """A document from :func:`dumps`'s text (bounded size; structure checked by :func:`restore`)."""
    if len(text) > MAX_DOC_BYTES:
        raise ActorStateError(f"actor state document of {len(text):,} bytes exceeds {MAX_DOC_BYTES:,}")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ActorStateError(f"actor state is not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ActorStateError(f"not an actor state document (valid: format {FORMAT})")
    return doc


def try_capture(state) -> Optional[Dict[str, Any]]:
    """:func:`capture`, or None where the envs' state is not data (ActorStateUnsupported)."""
    try:
        return capture(state)
    except ActorStateUnsupported:
        return None


if __name__ == "__main__":      # cost of one capture (module docstring)
    import time
    from core.actor import ActorSpec, ActorState
    s = ActorState(ActorSpec(run_id="bench", env_id="CartPole-v1", num_envs=8, seed=0, actor_id=0), 0)
    t0 = time.perf_counter()
    for _ in range(200):
        text = dumps(capture(s))
    print(f"capture+dumps: {(time.perf_counter() - t0) / 200 * 1e3:.3f} ms, {len(text):,} bytes")
