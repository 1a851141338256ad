"""R2D2 hyperparameters (the ``agent:`` section when ``algo: r2d2``).

Defaults follow R2D2 (Kapturowski et al. 2019) where they transfer to small
control tasks (eta 0.9, priority exponent 0.9, IS exponent 0.6, value
rescaling eps 1e-3, Ape-X epsilon ladder eps=0.4, alpha=7) and are scaled
down elsewhere (a 64-unit LSTM, sequences of 40 with a burn-in of 10,
n = 5, gamma = 0.99, Adam 1e-3, target update every 200 learner steps).

Replay ratio note: one learner step trains on ``batch_size`` sequences of
up to ``sequence_length - burn_in`` learning rows, so a ``learner.replay_ratio``
(learner steps per env step) of 0.03 trains on about ``0.03 * 32 * 30 = 29``
rows per env step, like DQN's ``0.5 * 64 = 32`` (configs/pomdp-cartpole-r2d2.yaml).

**Pixels** (``torso: nature_cnn``, configs/pong-r2d2.yaml): the Nature-DQN
conv torso of :func:`core.networks.nature_cnn_layers` (SEED RL's Atari
torso) on ``frame_stack`` stacked frames, an LSTM and, with ``dueling``, a
dueling head (SEED's ``DuelingLSTMDQNNet``). Replay stores each frame once;
the sampler reads ``frame_stack - 1`` extra leading rows so the learner can
restack them (:mod:`core.agents.r2d2.learning`).

The ladder needs the number of actors, which the builder's
``exploration(agent_cfg, env_steps, actor_id)`` does not see: set
``epsilon.num_actors`` to ``actors.num_actors``.
"""
from __future__ import annotations

import dataclasses
from typing import List, Literal, Union


@dataclasses.dataclass
class EpsilonLadderConfig:
    """Ape-X ladder: actor ``i`` of ``num_actors`` acts with ``base^(1 + alpha i / (num_actors - 1))``.

    ``num_actors`` should equal ``actors.num_actors``; actor ids beyond it wrap around.
    """
    base: float = 0.4
    alpha: float = 7.0
    num_actors: int = 4


@dataclasses.dataclass
class R2D2Config:
    algo: Literal["r2d2"] = "r2d2"
    # Widths of the obs MLP before the LSTM, or "nature_cnn" (pixels: conv torso, see module docstring).
    torso: Union[List[int], Literal["nature_cnn"]] = dataclasses.field(default_factory=lambda: [64])
    frame_stack: int = 1               # pixels: frames stacked on the channel axis (single frames are stored)
    lstm_size: int = 64
    head: List[int] = dataclasses.field(default_factory=lambda: [64])    # MLP between LSTM and Q
    dueling: bool = False              # Q = V + A - mean(A), each stream with its own ``head`` MLP (R2D2)
    gamma: float = 0.99
    n_step: int = 5
    sequence_length: int = 40          # rows per replayed sequence, burn-in included
    burn_in: int = 10                  # leading rows that only warm up the stored state
    value_rescaling_eps: float = 1e-3  # eps in h(x) = sign(x)(sqrt(|x|+1)-1) + eps x
    learning_rate: float = 1e-3
    adam_eps: float = 1e-3             # R2D2 uses a large Adam epsilon for stability
    batch_size: int = 32               # sequences per learner step
    target_update_period: int = 200    # learner steps between hard target updates
    max_grad_norm: float = 40.0
    priority_eta: float = 0.9          # p = eta max|delta| + (1 - eta) mean|delta|
    priority_exponent: float = 0.9     # alpha in P(i) ~ p_i^alpha
    importance_exponent: float = 0.6   # beta in w_i = (N P(i))^-beta
    # XLA-compile the learner step (online and target unrolls, gradient, Adam). A small LSTM step is op
    # dispatch more than arithmetic, which XLA fuses: on Zen 4 (benchmarks/micro/r2d2_first_step.py) POMDP
    # CartPole's step takes 0.63x the time, its first call 1.8 s more. Off by default: on pixels
    # (configs/catch-r2d2.yaml, Nature-CNN torso) the step takes 1.17x the time, convolutions being oneDNN's
    # strength, not XLA's.
    jit_compile: bool = False
    epsilon: EpsilonLadderConfig = dataclasses.field(default_factory=EpsilonLadderConfig)


#: key -> (predicate, valid range), checked by core.config.validate
RANGES = {
    "torso": (lambda v: v == "nature_cnn" or all(h >= 1 for h in v),
              "'nature_cnn' or a list of widths >= 1 (may be empty)"),
    "frame_stack": (lambda v: 1 <= v <= 16, "1..16"),
    "lstm_size": (lambda v: 1 <= v <= 4096, "1..4096"),
    "head": (lambda v: all(h >= 1 for h in v), "list of widths >= 1 (may be empty)"),
    "gamma": (lambda v: 0.0 <= v <= 1.0, "0..1"),
    "n_step": (lambda v: 1 <= v <= 100, "1..100"),
    "sequence_length": (lambda v: 2 <= v <= 1000, "2..1000"),
    "burn_in": (lambda v: v >= 0, ">= 0 and < sequence_length - 1"),
    "value_rescaling_eps": (lambda v: 0.0 < v < 1.0, "0 < eps < 1"),
    "learning_rate": (lambda v: 0.0 < v < 1.0, "0 < lr < 1"),
    "adam_eps": (lambda v: v > 0.0, "> 0"),
    "batch_size": (lambda v: v >= 1, ">= 1"),
    "target_update_period": (lambda v: v >= 1, ">= 1"),
    "max_grad_norm": (lambda v: v > 0.0, "> 0"),
    "priority_eta": (lambda v: 0.0 <= v <= 1.0, "0..1"),
    "priority_exponent": (lambda v: 0.0 <= v <= 1.0, "0..1"),
    "importance_exponent": (lambda v: 0.0 <= v <= 1.0, "0..1"),
    "epsilon.base": (lambda v: 0.0 <= v <= 1.0, "0..1"),
    "epsilon.alpha": (lambda v: v >= 0.0, ">= 0"),
    "epsilon.num_actors": (lambda v: v >= 1, ">= 1"),
}
