"""D4PGBuilder: wires D4PG's learner, n-step sampler and Gaussian-noise actors."""
from __future__ import annotations

from typing import Dict

from core.agents.base import AgentBuilder
from core.agents.d4pg.actor import noise_sigma


class D4PGBuilder(AgentBuilder):
    #: tanh policy output in [-1, 1] -> action bounds, plus Gaussian noise (core.exploration)
    action_selector = "tanh_gaussian"

    def make_learner(self, spec, agent_cfg, seed: int):
        from core.agents.d4pg.learning import D4PGLearner
        return D4PGLearner(spec, agent_cfg, seed=seed)

    def make_sampler(self, cache, agent_cfg):
        from core.replay import NStepSampler, PrioritizedNStepSampler
        if agent_cfg.prioritized:
            return PrioritizedNStepSampler(cache, n=agent_cfg.n_step, gamma=agent_cfg.gamma)
        return NStepSampler(cache, n=agent_cfg.n_step, gamma=agent_cfg.gamma)

    def exploration(self, agent_cfg, env_steps: int, actor_id: int) -> Dict[str, float]:
        return {"sigma": noise_sigma(agent_cfg.sigma, agent_cfg.sigma_min, agent_cfg.noise_ladder, actor_id)}

    def check_env(self, spec) -> None:
        from core.config import ConfigError
        if spec.discrete:
            raise ConfigError(f"agent 'd4pg' needs a continuous (Box) action space; {spec.env_id} has "
                              f"{spec.num_actions} discrete actions (use algo: dqn)")
