"""The config loader: YAML -> the typed dataclasses of the schema, ``--set`` overrides, validation.

A config is a tree of frozen-free dataclasses. ``load_config`` reads YAML,
applies ``key.sub=value`` overrides and builds the tree, rejecting unknown
keys, wrong types, out-of-range values, unknown env ids and unknown algorithms
with a one-line :class:`ConfigError` that names the key and the valid choices.
The resolved config is saved as JSON/YAML in the run directory and in every
checkpoint (``to_dict``).

Example::

    cfg = load_config("configs/default.yaml", overrides=["agent.n_step=5"])
    cfg.agent.n_step           # 5
    to_dict(cfg)["env"]["id"]  # "CartPole-v1"

The schema is :mod:`core.config.schema`, the checks :mod:`core.config.validation`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from typing import Any, Dict, List, Literal, Optional, Sequence

import yaml

from core.config.schema import Config, ConfigError
from core.config.validation import _RANGES, validate

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
DEFAULT_CONFIG = os.path.join(CONFIG_DIR, "default.yaml")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    if origin in (dict, Dict):
        return "a mapping of " + " to ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (list, List):
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "null")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against type ``tp``; return it converted (int -> float etc.)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' must be a mapping, got {value!r}")
        return _build(tp, value, key + ".")
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) and all(isinstance(c, str) for c in choices):
            # YAML 1.1 reads off/on/yes/no as booleans: map back to the spelled choice.
            spelled = [w for w in (("on", "yes", "true") if value else ("off", "no", "false")) if w in choices]
            value = spelled[0] if spelled else value
        if value not in choices:
            raise ConfigError(f"config key '{key}' = {value!r} is not valid; valid: {', '.join(map(str, choices))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(key, value, arg)
            except ConfigError:
                pass
        raise ConfigError(f"config key '{key}' must be {_type_name(tp)}, got {value!r}")
    if origin in (dict, Dict):
        k_tp, v_tp = typing.get_args(tp)
        try:
            if not isinstance(value, dict):
                raise ConfigError(value)
            return {_coerce(f"{key}.{k}", k, k_tp): _coerce(f"{key}.{k}", v, v_tp) for k, v in value.items()}
        except ConfigError:     # one line naming the valid forms (from _RANGES when the key has them)
            valid = _RANGES[key][1] if key in _RANGES else _type_name(tp)
            raise ConfigError(f"config key '{key}' = {value!r} is not valid; valid: {valid}") from None
    if origin in (list, List):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}' must be {_type_name(tp)}, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_coerce(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key '{key}' must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads '3e-4' (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}' must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config key '{key}' must be a string, got {value!r}")
        return value
    raise ConfigError(f"config key '{key}' has unsupported type {tp}")  # a bug in the schema


def _agent_class(data: Any) -> type:
    """The agent config dataclass named by ``agent.algo`` (default dqn)."""
    from core.agents import registry
    algo = data.get("algo", "dqn") if isinstance(data, dict) else "dqn"
    if algo not in registry.algorithms():
        raise ConfigError(f"config key 'agent.algo' = {algo!r} is not valid; valid: {', '.join(registry.algorithms())}")
    return registry.config_class(algo)


def _build(cls: type, data: Dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in hints:
            raise ConfigError(f"unknown config key '{prefix}{key}'; valid keys: {', '.join(names)}")
        tp = _agent_class(value) if cls is Config and key == "agent" else hints[key]
        kwargs[key] = _coerce(prefix + key, value, tp)
    if cls is Config and kwargs.get("agent") is None:
        kwargs["agent"] = _agent_class({})()
    return cls(**kwargs)


def _parse_scalar(text: str) -> Any:
    """Parse an override value with YAML rules (``3`` -> int, ``[1, 2]`` -> list)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: Dict[str, Any], overrides: Sequence[str]) -> Dict[str, Any]:
    """Apply ``key.sub=value`` overrides to a nested dict (in place) and return it."""
    _check_mapping(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: '{p}' is not a section")
        node[parts[-1]] = _parse_scalar(text)
    return data


def _check_mapping(data: Any) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a mapping at top level, got {type(data).__name__}; "
                          "valid: YAML of 'key: value' lines (see configs/default.yaml)")


def flatten(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def from_dict(data: Dict[str, Any]) -> Config:
    """Build and validate a Config from a (possibly partial) nested dict."""
    _check_mapping(data)
    return validate(_build(Config, data))


def load_config(path: Optional[str] = None, overrides: Sequence[str] = ()) -> Config:
    """Load YAML at ``path`` (default configs/default.yaml), apply overrides, validate."""
    path = path or DEFAULT_CONFIG
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist; configs ship in {CONFIG_DIR}")
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file {path!r} is not valid YAML{where}") from None
    return from_dict(apply_overrides(data, overrides))


def to_dict(cfg: Any) -> Dict[str, Any]:
    """The config as plain JSON-able data."""
    return dataclasses.asdict(cfg)


def to_json(cfg: Any) -> str:
    return json.dumps(to_dict(cfg), indent=2, sort_keys=True)
