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
import math
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
    max_episode_steps: Optional[int] = None   # None = the env's own time limit; else >= 1 (0 is an error)


@dataclasses.dataclass
class ActorsConfig:
    num_actors: int = 4                # concurrent actor tasks (each steps env.num_envs envs)
    steps_per_task: int = 32           # vector steps per rollout task
    precision: Literal["fp32", "fp16", "int8-dynamic", "int8-full"] = "int8-dynamic"
    broadcast_period: int = 250        # learner steps between policy versions
    calibration_size: int = 512        # replay observations used to calibrate int8-full
    policy_lag: int = 1                # learner blocks between a version and the rollouts that use it
                                       # (pipelines/run/plan.py); 0 = actors wait for every learner block
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
    # Dask resources of the worker that hosts the learner (pipelines/run/learner_stage.py), e.g.
    # {"GPU": 1} with `dask worker --resources "GPU=1"`; {} = in the driver process.
    resources: Dict[str, float] = dataclasses.field(default_factory=dict)


#: The valid forms of ``learner.resources`` (range and type errors name them).
LEARNER_RESOURCES_FORMS = ('{} (the learner in the driver process) or a mapping of Dask resource names to '
                           'amounts > 0 that a worker advertises, e.g. {"GPU": 1} (dask worker --resources "GPU=1")')


def _is_resources(v: Any) -> bool:
    return all(isinstance(k, str) and k.strip() and isinstance(n, (int, float)) and math.isfinite(n) and n > 0
               for k, n in v.items())


def check_learner_placement(cfg: "Config") -> None:
    """ConfigError (one line) unless the run's executor can honour ``learner.resources``.

    Only Dask places the learner by resources. The local executor runs it in
    process, Beam rounds have no long-lived learner to place, central
    inference serves from the learner's process, and ``checkpoint.engine dask``
    would have the learner's worker wait on other workers' tasks (its own
    threads write the checkpoints instead).
    """
    res = cfg.learner.resources
    if not res:
        return
    if cfg.executor != "dask":
        raise ConfigError(f"learner.resources {json.dumps(res)} needs executor 'dask', not {cfg.executor!r} "
                          f"(only Dask places the learner on a worker); valid: executor dask, or learner.resources {{}}")
    if cfg.inference == "central":
        raise ConfigError(f"learner.resources {json.dumps(res)} cannot be used with inference 'central' (the inference "
                          f"server runs beside the learner in the driver); valid: inference local, or learner.resources {{}}")
    if cfg.checkpoint.engine == "dask":
        raise ConfigError(f"learner.resources {json.dumps(res)} cannot be used with checkpoint.engine 'dask' (the "
                          f"learner's worker writes its checkpoints); valid: checkpoint.engine auto")


@dataclasses.dataclass
class CheckpointConfig:
    every_steps: int = 2_000           # learner steps between checkpoints
    keep_last: int = 3
    keep_every: Optional[int] = None   # also keep every step divisible by this (None = none; else >= 1)
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
class InferenceServerConfig:
    """The central inference server (``inference: central``; core.inference.endpoint)."""
    bind_host: Optional[str] = None    # None: unix socket (local), 127.0.0.1 (LocalCluster), or the
                                       # interface routing to dask.address; a wildcard is never the default
    tls_cert: Optional[str] = None     # PEM certificate chain; with tls_key, actors connect over TLS
    tls_key: Optional[str] = None      # PEM private key of tls_cert


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
    inference_server: InferenceServerConfig = dataclasses.field(default_factory=InferenceServerConfig)
    carbon: CarbonConfig = dataclasses.field(default_factory=CarbonConfig)
    threads: ThreadsConfig = dataclasses.field(default_factory=ThreadsConfig)


#: Schemes of Dask scheduler addresses (distributed.comm's backends less in-process ``inproc``).
DASK_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")


def _at_least(n: float) -> Any:
    return lambda v: v >= n


def _finite(pred: Any) -> Any:
    """``pred`` and finite: ``.inf`` / ``.nan`` in YAML never pass a range check."""
    return lambda v: math.isfinite(v) and pred(v)


def _optional(pred: Any) -> Any:
    return lambda v: v is None or pred(v)


def _is_dask_address(v: Any) -> bool:
    return v is None or dask_address_problem(v) is None


def _is_location(v: Any) -> bool:
    if v is None:
        return True
    if not v.strip():
        return False
    from core import urls
    try:
        urls.normalize(v)
    except urls.LocationError:
        return False
    return True


#: Seeds are offset by up to ~1e8 for actor, evaluation and calibration streams, and ALE seeds are
#: int32, so the config's seed stays well inside 0..2**31 - 1.
MAX_SEED = 1_000_000_000

# Range checks: key -> (predicate, description of the valid range). Every leaf of Config except
# ``agent`` (the algorithm's own RANGES), ``env.id`` (core.envs.check_env_id), booleans and
# Literal choices (checked by type) has an entry; tests/test_config.py asserts that property.
_RANGES: Dict[str, Tuple[Any, str]] = {
    "name": (lambda v: bool(v) and v not in (".", "..") and "/" not in v and "\\" not in v
             and v == v.strip(), "a non-empty name without '/', not '.' or '..' (it names runs/<name>)"),
    "seed": (lambda v: 0 <= v <= MAX_SEED, f"0..{MAX_SEED}"),
    "total_env_steps": (_at_least(1), ">= 1"),
    "run_dir": (_is_location, "null (runs/<name>), a local path, or a file://, memory://, gs://, s3:// URL"),
    "env.num_envs": (lambda v: 1 <= v <= 4096, "1..4096"),
    "env.max_episode_steps": (_optional(_at_least(1)), "null (the env's own time limit) or >= 1"),
    "actors.num_actors": (_at_least(1), ">= 1"),
    "actors.steps_per_task": (_at_least(1), ">= 1"),
    "actors.broadcast_period": (_at_least(1), ">= 1"),
    "actors.calibration_size": (_at_least(1), ">= 1"),
    "actors.policy_lag": (lambda v: 0 <= v <= 64, "0..64 (learner blocks)"),
    "actors.stall_timeout_s": (_finite(_at_least(0)), ">= 0 seconds (0 = auto)"),
    "replay.capacity": (_at_least(1), ">= 1"),
    "replay.min_size": (_at_least(1), ">= 1"),
    "replay.shard_target_bytes": (_at_least(1024), ">= 1024"),
    "replay.shard_max_rows": (_at_least(0), ">= 0 (0 = auto)"),
    "replay.chunk_bytes": (lambda v: 1024 <= v <= 1 << 30, "1024..1073741824 (1 KiB..1 GiB)"),
    "replay.write_threads": (lambda v: 1 <= v <= 256, "1..256"),
    "replay.retention_transitions": (_at_least(0), ">= 0 (0 = keep everything)"),
    "replay.gc_grace_s": (_finite(lambda v: v > 0), "> 0 seconds, finite"),
    "learner.replay_ratio": (_finite(lambda v: v > 0), "> 0, finite"),
    "learner.steps_per_call": (_at_least(1), ">= 1"),
    "learner.resources": (_is_resources, LEARNER_RESOURCES_FORMS),
    "checkpoint.every_steps": (_at_least(1), ">= 1"),
    "checkpoint.keep_last": (_at_least(1), ">= 1"),
    "checkpoint.keep_every": (_optional(_at_least(1)), "null (none kept beyond keep_last) or >= 1"),
    "eval.every_env_steps": (_at_least(1), ">= 1"),
    "eval.episodes": (_at_least(1), ">= 1"),
    "eval.target_return": (lambda v: not math.isnan(v), "a number (.inf = never stop at a target)"),
    "eval.confirm_episodes": (_at_least(0), ">= 0 (0 = no confirmation)"),
    "dask.address": (_is_dask_address, "null (a LocalCluster) or a scheduler address such as tcp://HOST:PORT"
                                       " (schemes: " + ", ".join(DASK_SCHEMES) + ")"),
    "dask.n_workers": (_at_least(0), ">= 0 (0 = one per core)"),
    "dask.threads_per_worker": (_at_least(1), ">= 1"),
    "dask.task_retries": (_at_least(0), ">= 0"),
    "carbon.country": (lambda v: len(v) == 3 and v.isascii() and v.isalpha(),
                       "an ISO-3166 alpha-3 code such as USA, FRA, DEU"),
    "carbon.pue": (_finite(_at_least(1.0)), ">= 1.0, finite (1.58 = experiment-impact-tracker's PUE)"),
    "threads.tf_intra_op": (_at_least(0), ">= 0 (0 = TF default)"),
    "threads.tf_inter_op": (_at_least(0), ">= 0 (0 = TF default)"),
    "threads.litert": (_at_least(1), ">= 1"),
}

#: Cross-field checks: (keys, predicate on the config, what is valid).
_CROSS: List[Tuple[Tuple[str, ...], Any, str]] = [
    (("replay.min_size", "replay.capacity"), lambda c: c.replay.min_size <= c.replay.capacity,
     "replay.min_size <= replay.capacity (the cache never holds more, so learning would never start)"),
]

def dask_address_problem(address: Any) -> Optional[str]:
    """None if ``address`` looks like a Dask scheduler address (``[scheme://]host:port``), else why not.

    Checked before a cluster is joined, so a typo is a one-line error rather than a
    ``ValueError`` from distributed after the run directory was written.
    """
    if not isinstance(address, str) or not address.strip():
        return "it is empty"
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    if scheme.lower() not in DASK_SCHEMES:
        return f"unknown scheme {scheme!r}"
    host, colon, port = rest.rstrip("/").rpartition(":")
    if scheme.lower() == "ucx" and not colon:
        return None if rest else "it has no host"
    if not colon or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        return "it is not HOST:PORT with a port 1..65535"
    return None


def check_dask_address(address: Optional[str], name: str = "--dask-address") -> None:
    """Raise a one-line ConfigError naming ``name`` unless ``address`` is None or a Dask address."""
    if address is None:
        return
    problem = dask_address_problem(address)
    if problem:
        raise ConfigError(f"{name} {address!r} is not a Dask scheduler address ({problem}); valid: "
                          f"tcp://HOST:PORT (schemes: {', '.join(DASK_SCHEMES)}), or none for a LocalCluster")


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


def _leaves(obj: Any, prefix: str = "") -> List[Tuple[str, Any]]:
    """``(dotted key, value)`` of every non-dataclass field of a config tree."""
    out: List[Tuple[str, Any]] = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += _leaves(value, f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, value))
    return out


def _check_ranges(cfg: Config) -> None:
    """Every range of _RANGES, the agent's RANGES, and finiteness of agent numbers without a range."""
    for key, (ok, desc) in _RANGES.items():
        if not ok(_get(cfg, key)):
            raise ConfigError(f"config key '{key}' = {_get(cfg, key)!r} is out of range; valid: {desc}")
    agent_ranges = getattr(importlib.import_module(type(cfg.agent).__module__), "RANGES", {})
    for key, (ok, desc) in agent_ranges.items():
        if not ok(_get(cfg.agent, key)):
            raise ConfigError(f"config key 'agent.{key}' = {_get(cfg.agent, key)!r} is out of range; valid: {desc}")
    for key, value in _leaves(cfg.agent):   # a NaN or inf the algorithm's RANGES does not cover
        if key not in agent_ranges and isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"config key 'agent.{key}' = {value!r} is out of range; valid: a finite number")
    for keys, ok, desc in _CROSS:
        if not ok(cfg):
            shown = " and ".join(f"'{k}' = {_get(cfg, k)!r}" for k in keys)
            raise ConfigError(f"config keys {shown} are inconsistent; valid: {desc}")


def validate(cfg: Config) -> Config:
    """Range checks and cross-field checks; raises ConfigError (one line).

    Everything here runs before a CLI writes anything, so a bad value never
    leaves a half-made run directory behind.
    """
    _check_ranges(cfg)
    from core.agents.registry import get_builder
    from core.envs import check_env_id, env_spec  # local import: envs imports gymnasium
    check_env_id(cfg.env.id)
    if cfg.checkpoint.engine == "dask" and cfg.executor != "dask":
        raise ConfigError(f"checkpoint.engine 'dask' needs executor 'dask', not {cfg.executor!r};"
                          " valid: checkpoint.engine auto")
    check_learner_placement(cfg)
    from core.inference.endpoint import EndpointError, check_config
    try:
        check_config(cfg.inference_server)
    except EndpointError as e:
        raise ConfigError(str(e)) from None
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
