"""Typed experiment configs: the schema, its validation and the loader (YAML, ``--set`` overrides).

One concept per module:

* ``schema``      the dataclasses of a config (one per section), PRECISIONS, EXECUTORS, ConfigError
* ``validation``  the valid range of every key, cross-field checks, ``validate``, Dask address checks
* ``loader``      YAML -> Config: ``load_config``, ``from_dict``, ``apply_overrides``, ``to_dict``/``to_json``

Example::

    cfg = load_config("configs/default.yaml", overrides=["agent.n_step=5"])
    cfg.agent.n_step           # 5
    to_dict(cfg)["env"]["id"]  # "CartPole-v1"
"""
from core.config.loader import (CONFIG_DIR, DEFAULT_CONFIG, apply_overrides, flatten, from_dict, load_config,
                                to_dict, to_json)
from core.config.schema import (EXECUTORS, PRECISIONS, ActorsConfig, CarbonConfig, CheckpointConfig, Config,
                                ConfigError, DaskConfig, EnvConfig, EvalConfig, InferenceServerConfig,
                                LearnerConfig, ReplayConfig, ThreadsConfig)
from core.config.validation import (DASK_SCHEMES, LEARNER_RESOURCES_FORMS, MAX_SEED, check_dask_address,
                                    check_learner_placement, dask_address_problem, validate)

__all__ = ["CONFIG_DIR", "DEFAULT_CONFIG", "apply_overrides", "flatten", "from_dict", "load_config", "to_dict",
           "to_json", "EXECUTORS", "PRECISIONS", "ActorsConfig", "CarbonConfig", "CheckpointConfig", "Config",
           "ConfigError", "DaskConfig", "EnvConfig", "EvalConfig", "InferenceServerConfig", "LearnerConfig",
           "ReplayConfig", "ThreadsConfig", "DASK_SCHEMES", "LEARNER_RESOURCES_FORMS", "MAX_SEED",
           "check_dask_address", "check_learner_placement", "dask_address_problem", "validate"]
