"""The config schema: typed dataclasses, one per section, with their defaults and the one error type.

A config is a tree of frozen-free dataclasses (:class:`Config` at the root;
``agent`` is the algorithm's own config class, :mod:`core.agents.registry`).
What values are valid is :mod:`core.config.validation`; reading YAML and
``--set`` overrides into this tree is :mod:`core.config.loader`.

Example::

    cfg = Config(env=EnvConfig(id="CartPole-v1", num_envs=8))
    cfg.replay.writer_options()        # {"chunk_bytes": 2097152, "threads": 2}

Threads: the machine this is tuned for has 2 cores shared by the learner
(TensorFlow), the Dask workers (actors: LiteRT + envs) and I/O. ``threads``
pins TF to 1 intra-op and 1 inter-op thread, LiteRT to 1 thread per actor,
and the embedded Dask cluster to one single-threaded worker per core, so the
processes share the cores instead of oversubscribing them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Literal, Optional

PRECISIONS = ("fp32", "fp16", "int8-dynamic", "int8-full")
EXECUTORS = ("local", "dask", "beam")


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


@dataclasses.dataclass
class CheckpointConfig:
    every_steps: int = 2_000           # learner steps between checkpoints
    keep_last: int = 3
    keep_every: Optional[int] = None   # also keep every step divisible by this (None = none; else >= 1)
    engine: Literal["auto", "dask"] = "auto"   # dask: the run's Dask workers write the chunks
                                               # (executor dask; a run dir every worker reaches)
    write_threads: int = 2             # the checkpoint writer's threads: encode/write chunks and copy state
                                       # to host (engine dask: the writer's own creates and scalars)


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
