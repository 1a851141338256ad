"""Config validation: the valid range of every key, cross-field checks, and checks against the registry.

Every check raises a one-line :class:`~core.config.schema.ConfigError` that
names the key, its value and what is valid, before a CLI writes anything:
ranges of every leaf (:data:`_RANGES`, and the algorithm's own ``RANGES``),
finiteness, cross-field consistency (:data:`_CROSS`), the env id, the
learner's placement, the inference endpoint and the algorithm's own checks.

Example::

    validate(cfg)                        # cfg, or ConfigError("config key 'seed' = -1 is out of range; ...")
    dask_address_problem("tcp://h:0")    # "it is not HOST:PORT with a port 1..65535"
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
from typing import Any, Dict, List, Optional, Tuple

from core.config.schema import Config, ConfigError

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
# Literal choices (checked by type) has an entry; tests/core/test_config.py asserts that property.
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
    "checkpoint.write_threads": (lambda v: 1 <= v <= 256, "1..256"),
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
