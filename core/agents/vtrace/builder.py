"""VTraceBuilder: wires the V-trace learner, the unroll sampler and categorical actors.

Actors sample ``a ~ softmax(logits)`` from the (quantized) policy and store
the logits they acted with (``extras/logits``), which the learner uses as the
behaviour policy ``mu``.
"""
from __future__ import annotations

from typing import Dict

from core.agents.base import AgentBuilder


class VTraceBuilder(AgentBuilder):
    action_selector = "categorical"

    def make_learner(self, spec, agent_cfg, seed: int):
        from core.agents.vtrace.learning import VTraceLearner
        return VTraceLearner(spec, agent_cfg, seed=seed)

    def make_sampler(self, cache, agent_cfg):
        """Sequences of ``T + 1`` rows (plus ``frame_stack - 1`` rows of frame history)."""
        from core.replay import SequenceSampler
        history = agent_cfg.frame_stack - 1
        return SequenceSampler(cache, length=agent_cfg.unroll_length + 1 + history, burn_in=history)

    def exploration(self, agent_cfg, env_steps: int, actor_id: int) -> Dict[str, float]:
        return {}   # exploration is the stochastic policy itself (plus its entropy bonus)

    def check_env(self, spec) -> None:
        from core.config import ConfigError
        if not spec.discrete:
            raise ConfigError(f"agent 'vtrace' needs a discrete action space; {spec.env_id} has continuous "
                              f"actions (use a continuous-control agent)")
