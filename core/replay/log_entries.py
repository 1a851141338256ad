"""Commit-log entry validation: every entry is checked for shape and types as it is read.

An entry read from the log is trusted by everything downstream: its shard ids
become paths that readers open and ``gc`` deletes, its row counts become the
store's size. So each entry (and each log checkpoint) is checked before it is
folded, and anything but the shapes below is a ``LogDamagedError`` naming the
version ("commit log is damaged at version N: ..."), never a ``KeyError``
traceback or a silently wrong state::

    {"version": N, "op": "add", "shards": [SHARD_INFO, ...], "time": float, ...}
    {"version": N, "op": "remove" | "quarantine", "shards": [SHARD_ID, ...], ...}
    {"version": N, "op": "replace", "groups": [{"remove": [SHARD_ID, ...],
                                                "add": [SHARD_INFO, ...]}, ...], ...}

    SHARD_ID:   schema.SHARD_ID_RE, e.g. "s00000001", "r000003-g0001"
    SHARD_INFO: {"id": SHARD_ID, "rows": int >= 0, "nbytes": int >= 0,
                 optional "token": str, "created": number,
                 "policy_version_min"/"policy_version_max": int, "num_segments": int >= 0}

Other keys (``writer``, ``meta``, ``reason``) are free-form and ignored.

Example::

    entry = check_entry(json.loads(raw), version=7, store_url="runs/a/replay")
"""
from __future__ import annotations

from typing import Any, Dict, List

from core.replay.schema import LogDamagedError, is_shard_id

OPS = ("add", "remove", "quarantine", "replace")
_INT_FIELDS = {"rows": 0, "nbytes": 0, "num_segments": 0, "policy_version_min": None,
               "policy_version_max": None}  # field -> minimum (None: any int)


class _Bad(Exception):
    """Internal: what is wrong with an entry (turned into LogDamagedError with its version)."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _shard_id(value: Any, where: str) -> str:
    if not is_shard_id(value):
        raise _Bad(f"{where} has invalid shard id {value!r} (valid: e.g. 's00000001', 'r000003-g0001')")
    return value


def _list(value: Any, where: str) -> List[Any]:
    if not isinstance(value, list):
        raise _Bad(f"{where} is {type(value).__name__ if value is not None else 'missing'}, not a list")
    return value


def _shard_info(d: Any, where: str) -> None:
    if not isinstance(d, dict):
        raise _Bad(f"{where} is {type(d).__name__}, not a shard object")
    _shard_id(d.get("id"), where)
    for name, minimum in _INT_FIELDS.items():
        if name not in d and name not in ("rows", "nbytes"):
            continue
        v = d.get(name)
        if not _is_int(v) or (minimum is not None and v < minimum):
            raise _Bad(f"{where} ({d['id']}) has {name}={v!r}; valid: an integer"
                       + (f" >= {minimum}" if minimum is not None else ""))
    if "token" in d and not isinstance(d["token"], str):
        raise _Bad(f"{where} ({d['id']}) has token={d['token']!r}; valid: a string")
    if "created" in d and not _is_number(d["created"]):
        raise _Bad(f"{where} ({d['id']}) has created={d['created']!r}; valid: a number")


def _check(entry: Any, version: int) -> None:
    if not isinstance(entry, dict):
        raise _Bad(f"the entry is a JSON {type(entry).__name__}, not an object")
    if not entry:
        raise _Bad("the entry is an empty object {}")
    if "version" not in entry:
        raise _Bad(f"the entry has no 'version' (keys: {', '.join(sorted(map(str, entry))[:6])})")
    if not _is_int(entry["version"]):
        raise _Bad(f"'version' is {entry['version']!r}; valid: the integer {version}")
    if entry["version"] != version:
        raise _Bad(f"the entry in file {version} says version {entry['version']}")
    op = entry.get("op")
    if op not in OPS:
        raise _Bad(f"'op' is {op!r}; valid: {', '.join(OPS)}")
    if "time" in entry and not _is_number(entry["time"]):
        raise _Bad(f"'time' is {entry['time']!r}; valid: a number")
    if op == "add":
        for i, d in enumerate(_list(entry.get("shards"), "'shards'")):
            _shard_info(d, f"shards[{i}]")
    elif op in ("remove", "quarantine"):
        for i, sid in enumerate(_list(entry.get("shards"), "'shards'")):
            _shard_id(sid, f"shards[{i}]")
    else:
        for g, group in enumerate(_list(entry.get("groups"), "'groups'")):
            if not isinstance(group, dict):
                raise _Bad(f"groups[{g}] is {type(group).__name__}, not an object")
            for i, sid in enumerate(_list(group.get("remove"), f"groups[{g}].remove")):
                _shard_id(sid, f"groups[{g}].remove[{i}]")
            for i, d in enumerate(_list(group.get("add"), f"groups[{g}].add")):
                _shard_info(d, f"groups[{g}].add[{i}]")


def check_entry(entry: Any, version: int, store_url: str) -> Dict[str, Any]:
    """``entry`` if it is a well-formed entry for ``version``; LogDamagedError otherwise."""
    try:
        _check(entry, version)
    except _Bad as e:
        raise LogDamagedError(store_url, version, str(e)) from None
    return entry


def check_checkpoint(d: Any) -> None:
    """ValueError if a log checkpoint's JSON is not well formed (the reader then folds entries)."""
    try:
        if not isinstance(d, dict) or not _is_int(d.get("version")) or d["version"] < 0:
            raise _Bad("no integer 'version'")
        infos = _list(d.get("infos"), "'infos'")
        for i, info in enumerate(infos):
            _shard_info(info, f"infos[{i}]")
        known = {info["id"] for info in infos}
        for i, sid in enumerate(_list(d.get("live"), "'live'")):
            if _shard_id(sid, f"live[{i}]") not in known:
                raise _Bad(f"live shard {sid!r} has no info")
        for key, check in (("committed_version", _is_int), ("removed", _is_number),
                           ("quarantined", lambda v: isinstance(v, str))):
            table = d.get(key)
            if not isinstance(table, dict):
                raise _Bad(f"{key!r} is not an object")
            for sid, value in table.items():
                _shard_id(sid, key)
                if not check(value):
                    raise _Bad(f"{key}[{sid!r}] = {value!r} has the wrong type")
    except _Bad as e:
        raise ValueError(f"malformed log checkpoint: {e}") from None
