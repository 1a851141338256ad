"""The agent seam: what the driver needs from an algorithm, and nothing more.

An algorithm lives in ``core/agents/<algo>/`` (config, networks, losses,
learning, actor, builder) and registers an :class:`AgentBuilder` in
:mod:`core.agents.registry`. The driver and every executor then train it
without algorithm-specific code::

    builder = get_builder(cfg.agent.algo)
    builder.check_env(spec)                          # ConfigError if incompatible
    learner = builder.make_learner(spec, cfg.agent, seed)
    sampler = builder.make_sampler(cache, cfg.agent)
    while training:
        explore = builder.exploration(cfg.agent, env_steps, actor_id)   # per rollout task
        run_rollout_task(spec_with(builder.action_selector), payload, k, T, explore)
        learner.step(sampler.sample(...))
        payload = quantizer.quantize(learner.policy_model, version)
"""
from __future__ import annotations

import abc
from typing import Any, Dict, Protocol


class Learner(Protocol):
    """A learner trains in fp32 and exposes the network actors act with."""

    policy_model: Any            # a Keras model; quantized before broadcast

    def step(self, batch: Dict[str, Any]) -> Dict[str, Any]: ...   # one or [K] gradient steps
    def state(self) -> Dict[str, Dict[str, Any]]: ...               # nested host arrays
    def params(self) -> Dict[str, Any]: ...                          # == state()["params"], cheaper
    def restore(self, state: Dict[str, Dict[str, Any]]) -> None: ...

    @property
    def steps(self) -> int: ...


class AgentBuilder(abc.ABC):
    """Builds one algorithm's learner, sampler and actor-side exploration."""

    #: name of the action selector in :mod:`core.exploration` run by actors
    action_selector: str = "epsilon_greedy"

    @abc.abstractmethod
    def make_learner(self, spec, agent_cfg, seed: int) -> Learner: ...

    @abc.abstractmethod
    def make_sampler(self, cache, agent_cfg): ...

    @abc.abstractmethod
    def exploration(self, agent_cfg, env_steps: int, actor_id: int) -> Dict[str, float]:
        """Parameters of the action selector for one rollout task."""

    def check_env(self, spec) -> None:
        """Raise ``ConfigError`` if this algorithm cannot act in ``spec``'s env."""

    def check_config(self, cfg) -> None:
        """Raise ``ConfigError`` for run settings this algorithm does not support (inference mode, ...)."""
