"""DQNBuilder: wires DQN's learner, n-step sampler and epsilon-greedy actors."""
from __future__ import annotations

from typing import Dict

from core.agents.base import AgentBuilder
from core.agents.dqn.actor import LinearEpsilon


class DQNBuilder(AgentBuilder):
    action_selector = "epsilon_greedy"

    def make_learner(self, spec, agent_cfg, seed: int):
        from core.agents.dqn.learning import DQNLearner
        return DQNLearner(spec, agent_cfg, seed=seed)

    def make_sampler(self, cache, agent_cfg):
        from core.replay import NStepSampler, PrioritizedNStepSampler
        if agent_cfg.prioritized:
            return PrioritizedNStepSampler(cache, n=agent_cfg.n_step, gamma=agent_cfg.gamma)
        return NStepSampler(cache, n=agent_cfg.n_step, gamma=agent_cfg.gamma)

    def exploration(self, agent_cfg, env_steps: int, actor_id: int) -> Dict[str, float]:
        eps = agent_cfg.epsilon
        return {"epsilon": LinearEpsilon(eps.start, eps.end, eps.decay_steps)(env_steps)}

    def check_env(self, spec) -> None:
        from core.config import ConfigError
        if not spec.discrete:
            raise ConfigError(f"agent 'dqn' needs a discrete action space; {spec.env_id} has continuous "
                              f"actions (use a continuous-control agent)")
