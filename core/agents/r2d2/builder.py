"""R2D2Builder: wires the recurrent learner, prioritized sequence replay and ladder actors.

Actors run the selector ``recurrent_epsilon_greedy`` (:mod:`core.exploration`):
the LiteRT step model ``[obs, h, c] -> [q, h', c']`` with the state carried by
:class:`core.agents.r2d2.actor.LSTMCarry` (stored as ``extras/lstm_h``,
``extras/lstm_c``), then epsilon-greedy on ``q`` with the actor's rung of the
Ape-X ladder. With local inference the actors carry the state, so it runs
unchanged on the local, Dask and Beam executors. With ``inference: central``
(SEED) the inference server keeps one carry per connected actor, batches the
recurrent step across actors and stores the same extras
(:mod:`core.inference.server`); each actor keeps its own rung of the ladder.
Both paths feed the same prioritized sequence sampler.

Pixels (``torso: nature_cnn``, ``frame_stack: k``): actors and the server
stack the last ``k`` frames into the step model's input; replay stores single
frames and the sampler reads ``k - 1`` extra leading rows of frame history per
sequence, which count as burn-in (:mod:`core.agents.r2d2.learning`).
"""
from __future__ import annotations

from typing import Dict

from core.agents.base import AgentBuilder
from core.agents.r2d2.actor import ladder_epsilon


class R2D2Builder(AgentBuilder):
    action_selector = "recurrent_epsilon_greedy"

    def make_learner(self, spec, agent_cfg, seed: int):
        from core.agents.r2d2.learning import R2D2Learner
        return R2D2Learner(spec, agent_cfg, seed=seed)

    def make_sampler(self, cache, agent_cfg):
        from core.agents.r2d2.sampler import PrioritizedSequenceSampler
        history = agent_cfg.frame_stack - 1      # rows that only feed the first stacked frames
        return PrioritizedSequenceSampler(cache, length=agent_cfg.sequence_length + history,
                                          burn_in=agent_cfg.burn_in + history,
                                          alpha=agent_cfg.priority_exponent, beta=agent_cfg.importance_exponent)

    def exploration(self, agent_cfg, env_steps: int, actor_id: int) -> Dict[str, float]:
        e = agent_cfg.epsilon
        return {"epsilon": ladder_epsilon(actor_id, e.num_actors, e.base, e.alpha)}

    def check_env(self, spec) -> None:
        from core.config import ConfigError
        if not spec.discrete:
            raise ConfigError(f"agent 'r2d2' needs a discrete action space; {spec.env_id} has continuous "
                              f"actions (use a continuous-control agent)")

    def check_config(self, cfg) -> None:
        from core.config import ConfigError
        from core.envs import env_spec
        a, shape = cfg.agent, tuple(env_spec(cfg.env.id).obs_shape)
        if (a.torso == "nature_cnn" or a.frame_stack > 1) and len(shape) not in (2, 3):
            what = "agent.torso 'nature_cnn'" if a.torso == "nature_cnn" else f"agent.frame_stack {a.frame_stack}"
            raise ConfigError(f"{what} needs image observations [H, W] or [H, W, C]; {cfg.env.id} has "
                              f"shape {list(shape)} (valid: an atari:<Game> env, or an MLP torso and frame_stack 1)")
        if cfg.actors.precision == "int8-full":
            raise ConfigError("agent 'r2d2' does not support actors.precision 'int8-full' (calibration needs the "
                              "recurrent state inputs); valid: fp32, fp16, int8-dynamic")
