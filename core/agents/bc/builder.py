"""BCBuilder: behaviour cloning's learner, a 1-step sampler and greedy actors."""
from __future__ import annotations

from typing import Dict

from core.agents.base import AgentBuilder


class BCBuilder(AgentBuilder):
    action_selector = "epsilon_greedy"   # argmax of the logits (epsilon 0)

    def make_learner(self, spec, agent_cfg, seed: int):
        from core.agents.bc.learning import BCLearner
        return BCLearner(spec, agent_cfg, seed=seed)

    def make_sampler(self, cache, agent_cfg):
        from core.replay import NStepSampler
        return NStepSampler(cache, n=agent_cfg.n_step, gamma=agent_cfg.gamma)

    def exploration(self, agent_cfg, env_steps: int, actor_id: int) -> Dict[str, float]:
        return {"epsilon": 0.0}

    def check_env(self, spec) -> None:
        from core.config import ConfigError
        if not spec.discrete:
            raise ConfigError(f"agent 'bc' needs a discrete action space; {spec.env_id} has continuous actions")
