"""Typed experiment configs: YAML -> dataclasses, ``--set`` overrides, validation.

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

Threads: the machine this is tuned for has 2 cores shared by the learner
(TensorFlow), the Dask workers (actors: LiteRT + envs) and I/O. ``threads``
pins TF to 1 intra-op and 1 inter-op thread, LiteRT to 1 thread per actor,
and the embedded Dask cluster to one single-threaded worker per core, so the
processes share the cores instead of oversubscribing them.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import types
import typing
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple

import yaml

PRECISIONS = ("fp32", "fp16", "int8-dynamic", "int8-full")
EXECUTORS = ("local", "dask", "beam")
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
DEFAULT_CONFIG = os.path.join(CONFIG_DIR, "default.yaml")


class ConfigError(ValueError):
    """An invalid config: the message is one line naming the key and valid choices."""


@dataclasses.dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    num_envs: int = 8                  # vectorized envs per actor task
    max_episode_steps: Optional[int] = None


@dataclasses.dataclass
class ActorsConfig:
    num_actors: int = 4                # concurrent actor tasks (each steps env.num_envs envs)
    steps_per_task: int = 32           # vector steps per rollout task
    precision: Literal["fp32", "fp16", "int8-dynamic", "int8-full"] = "int8-dynamic"
    broadcast_period: int = 250        # learner steps between policy versions
    calibration_size: int = 512        # replay observations used to calibrate int8-full
    policy_lag: int = 1                # learner blocks between a version and the rollouts that use it
                                       # (pipelines/plan.py); 0 = actors wait for every learner block
    stall_timeout_s: float = 0.0       # no progress this long: one-line error (0 = max(120 s, 10x slowest task))


@dataclasses.dataclass
class ReplayConfig:
    capacity: int = 100_000            # transitions kept in the learner's cache (FIFO)
    min_size: int = 1_000              # transitions before learning starts
    shard_target_bytes: int = 4 << 20  # aggregate tasks into shards of about this size ...
    shard_max_rows: int = 0            # ... or flush after this many rows (learner freshness);
                                       # 0 = one round of tasks (num_actors x num_envs x steps), >= 512
    chunk_bytes: int = 2 << 20         # raw bytes per stored chunk (zarr), 1 KiB..1 GiB; 1-8 MiB is efficient
    write_threads: int = 2             # tensorstore encoder threads of the shard writer (the driver's)
    retention_transitions: int = 1_000_000   # FIFO bound of the durable store (0 = keep everything)
    gc_grace_s: float = 600.0          # uncommitted shards older than this are garbage-collected

    def writer_options(self) -> dict:
        """Shard writer options for ``ReplayStore.open``/``open_or_create``."""
        return {"chunk_bytes": self.chunk_bytes, "threads": self.write_threads}


@dataclasses.dataclass
class LearnerConfig:
    replay_ratio: float = 0.5          # learner steps per env step (SB3 zoo: 128 per 256)
    steps_per_call: int = 16           # learner steps between scheduling decisions


@dataclasses.dataclass
class CheckpointConfig:
    every_steps: int = 2_000           # learner steps between checkpoints
    keep_last: int = 3
    keep_every: Optional[int] = None
    engine: Literal["auto", "dask"] = "auto"   # dask: the run's Dask workers write the chunks
                                               # (executor dask; a run dir every worker reaches)


@dataclasses.dataclass
class EvalConfig:
    every_env_steps: int = 4_000
    episodes: int = 20
    target_return: float = 475.0
    confirm_episodes: int = 100        # an eval at target counts only if this many fresh episodes agree
    stop_at_target: bool = True        # stop training once a (confirmed) eval reaches target


@dataclasses.dataclass
class DaskConfig:
    address: Optional[str] = None      # tcp://host:port joins a cluster; None starts a LocalCluster
    n_workers: int = 0                 # 0 = one per core
    threads_per_worker: int = 1
    task_retries: int = 3


@dataclasses.dataclass
class CarbonConfig:
    """Energy/CO2e accounting per run (core.carbon)."""
    backend: Literal["auto", "codecarbon", "eit", "process-time", "off"] = "auto"
    country: str = "USA"               # ISO-3166 alpha-3 code for the grid's carbon intensity
    pue: float = 1.0                   # 1.58 applies experiment-impact-tracker's accounting (ActorQ paper)


@dataclasses.dataclass
class ThreadsConfig:
    tf_intra_op: int = 1
    tf_inter_op: int = 1
    litert: int = 1


@dataclasses.dataclass
class Config:
    name: str = "cartpole-dqn"
    seed: int = 0
    total_env_steps: int = 60_000
    executor: Literal["local", "dask", "beam"] = "dask"
    inference: Literal["local", "central"] = "local"   # central = SEED-style batched inference server
    run_dir: Optional[str] = None      # default runs/<name>
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    agent: Any = None                  # the algorithm's config class (core.agents.registry), default dqn
    actors: ActorsConfig = dataclasses.field(default_factory=ActorsConfig)
    replay: ReplayConfig = dataclasses.field(default_factory=ReplayConfig)
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    dask: DaskConfig = dataclasses.field(default_factory=DaskConfig)
    carbon: CarbonConfig = dataclasses.field(default_factory=CarbonConfig)
    threads: ThreadsConfig = dataclasses.field(default_factory=ThreadsConfig)


# Range checks: key -> (predicate, description of the valid range).
_RANGES: Dict[str, Tuple[Any, str]] = {
    "total_env_steps": (lambda v: v > 0, "> 0"),
    "env.num_envs": (lambda v: 1 <= v <= 4096, "1..4096"),
    "actors.num_actors": (lambda v: v >= 1, ">= 1"),
    "actors.steps_per_task": (lambda v: v >= 1, ">= 1"),
    "actors.broadcast_period": (lambda v: v >= 1, ">= 1"),
    "actors.calibration_size": (lambda v: v >= 1, ">= 1"),
    "actors.policy_lag": (lambda v: 0 <= v <= 64, "0..64 (learner blocks)"),
    "actors.stall_timeout_s": (lambda v: v >= 0, ">= 0 (0 = auto)"),
    "replay.capacity": (lambda v: v >= 1, ">= 1"),
    "replay.min_size": (lambda v: v >= 1, ">= 1"),
    "replay.shard_target_bytes": (lambda v: v >= 1024, ">= 1024"),
    "replay.shard_max_rows": (lambda v: v >= 0, ">= 0 (0 = auto)"),
    "replay.chunk_bytes": (lambda v: 1024 <= v <= 1 << 30, "1024..1073741824 (1 KiB..1 GiB)"),
    "replay.write_threads": (lambda v: v >= 1, ">= 1"),
    "replay.retention_transitions": (lambda v: v >= 0, ">= 0 (0 = keep everything)"),
    "replay.gc_grace_s": (lambda v: v > 0, "> 0"),
    "learner.replay_ratio": (lambda v: v > 0, "> 0"),
    "learner.steps_per_call": (lambda v: v >= 1, ">= 1"),
    "checkpoint.every_steps": (lambda v: v >= 1, ">= 1"),
    "checkpoint.keep_last": (lambda v: v >= 1, ">= 1"),
    "eval.every_env_steps": (lambda v: v >= 1, ">= 1"),
    "eval.episodes": (lambda v: v >= 1, ">= 1"),
    "eval.confirm_episodes": (lambda v: v >= 0, ">= 0 (0 = no confirmation)"),
    "dask.n_workers": (lambda v: v >= 0, ">= 0 (0 = one per core)"),
    "dask.threads_per_worker": (lambda v: v >= 1, ">= 1"),
    "dask.task_retries": (lambda v: v >= 0, ">= 0"),
    "threads.tf_intra_op": (lambda v: v >= 0, ">= 0 (0 = TF default)"),
    "threads.tf_inter_op": (lambda v: v >= 0, ">= 0 (0 = TF default)"),
    "threads.litert": (lambda v: v >= 1, ">= 1"),
    "carbon.pue": (lambda v: v >= 1.0, ">= 1.0"),
}


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
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


def validate(cfg: Config) -> Config:
    """Range checks and cross-field checks; raises ConfigError (one line)."""
    for key, (ok, desc) in _RANGES.items():
        if not ok(_get(cfg, key)):
            raise ConfigError(f"config key '{key}' = {_get(cfg, key)!r} is out of range; valid: {desc}")
    for key, (ok, desc) in getattr(importlib.import_module(type(cfg.agent).__module__), "RANGES", {}).items():
        if not ok(_get(cfg.agent, key)):
            raise ConfigError(f"config key 'agent.{key}' = {_get(cfg.agent, key)!r} is out of range; valid: {desc}")
    from core.agents.registry import get_builder
    from core.envs import check_env_id, env_spec  # local import: envs imports gymnasium
    check_env_id(cfg.env.id)
    if cfg.checkpoint.engine == "dask" and cfg.executor != "dask":
        raise ConfigError(f"checkpoint.engine 'dask' needs executor 'dask', not {cfg.executor!r};"
                          " valid: checkpoint.engine auto")
    builder = get_builder(cfg.agent.algo)
    builder.check_env(env_spec(cfg.env.id))
    builder.check_config(cfg)
    return cfg


def _get(cfg: Any, key: str) -> Any:
    for p in key.split("."):
        cfg = getattr(cfg, p)
    return cfg


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
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a mapping at top level, got {type(data).__name__}")
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
