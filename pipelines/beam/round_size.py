"""How many plan blocks a Beam round holds: job start-up at most 10% of the run's wall time.

Every round is one Beam job, and a job costs a start-up ``S`` (the DirectRunner
spawns its worker processes; Dataflow boots workers, installs the package and
receives the job graph) before block work of ``c`` seconds a block. A run of
``B`` blocks in ``J`` jobs spends ``J S`` starting and ``B c`` working, so::

    share = J S / (J S + B c) <= 10%   <=>   J <= B c / (9 S)
    J = max(1, floor(B c / (9 S)))      the most jobs that keep the share within 10%
    blocks per round = ceil(B / J)      (a run shorter than ~ten start-ups, B c < 9 S: one job)

The launcher applies the rule to the blocks still to run before every round,
with what it has measured so far: ``c`` from the previous round (the seconds
its ``RunBlocks`` stage worked, per block), ``S`` from the previous round's
pipeline wall time less that work. Before the first round it uses the
defaults: ``S`` from :data:`STARTUP_S` (or ``--round_startup_s``, which then
holds for the whole run) and ``c`` from :func:`estimate_block_s`, a cost model
of the config. Fewer jobs than the rule allows never changes a run's results
(rounds only cut the plan's blocks into jobs; bit-identity across round
sizes is tested), only how often it is resumable between jobs.

Example::

    sizing = size_rounds(cfg, "DataflowRunner", startup_s=180.0)
    sizing.blocks_per_round, sizing.jobs, sizing.share      # e.g. 2084 -> 4 jobs of 521 blocks, 8.7%
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

#: Start-up share of a run's wall time that round sizing keeps within.
TARGET_SHARE = 0.10

#: Seconds a job takes to start, before the first measured round. The DirectRunner (multi_processing, the
#: one worker process a round uses): 5.8-10.7 s per pipeline, measured 2026-12-04 on 2 shared cores (load ~4),
#: a one-element pipeline. Dataflow: not measured here (never run on real Dataflow); batch jobs take ~2-4 min
#: to boot workers and install the package, so 180 s; ``--round_startup_s S`` sets another.
STARTUP_S = {"direct": 8.0, "dataflow": 180.0}

# The cost model's constants (estimate_block_s), fitted to this project's measured per-step costs
# (benchmarks/results/actorq-costs-*.json, 2 cores): an ActorQ 3x2048 DQN learner step (batch 64) 49 ms (model:
# 65 ms), a D4PG step (batch 128) 218 ms (model: 130 ms; forward + backward = 3x the forward FLOPs); env steps: classic control ~10 us, dm_control ~200 us per physics step.
_LEARNER_FLOPS = 50e9          # effective fp32 FLOP/s of a learner step on the CPU
_ACTOR_FLOPS = 20e9            # effective FLOP/s of an actor's int8 LiteRT inference
_STEP_OVERHEAD_S = 2e-3        # a learner step's fixed cost (sampling, tf.function call)
_VECTOR_STEP_S = 60e-6         # an actor's per-vector-step Python cost (inference call, bookkeeping)
_ROW_S = 60e-6                 # a row's share of the shard write, commit and cache refresh
_NATURE_CNN_FLOPS = 38e6       # forward FLOPs of the Nature CNN on one 84x84x4 frame (2 x MACs)


@dataclasses.dataclass(frozen=True)
class RoundSizing:
    """A run's round plan: what ``--show-rounds`` prints and the launcher follows."""
    plan_blocks: int
    blocks_per_round: int
    jobs: int
    startup_s: float
    block_s: float
    share: float            # estimated job start-up share of the run's wall time
    chosen: str             # "rule" (start-up <= 10%) or "--blocks_per_round"


def runner_kind(runner: str) -> str:
    """``direct`` for the runners that run on this machine (DirectRunner, Prism), else ``dataflow``."""
    from pipelines.executors.beam import is_local_runner
    return "direct" if is_local_runner(["--runner", runner]) else "dataflow"


def jobs_within_share(blocks: int, block_s: float, startup_s: float) -> int:
    """The most jobs that keep start-up within :data:`TARGET_SHARE` of ``blocks`` blocks' run (at least 1)."""
    if startup_s <= 0:
        return max(1, blocks)
    budget = blocks * block_s * TARGET_SHARE / (1 - TARGET_SHARE)     # J S <= B c / 9
    return max(1, min(blocks, math.floor(budget / startup_s)))


def blocks_per_round(blocks: int, block_s: float, startup_s: float) -> int:
    """Blocks in each of the :func:`jobs_within_share` equal rounds (the last may be shorter)."""
    return max(1, math.ceil(blocks / jobs_within_share(blocks, block_s, startup_s)))


def startup_share(jobs: int, blocks: int, block_s: float, startup_s: float) -> float:
    total = jobs * startup_s + blocks * block_s
    return jobs * startup_s / total if total > 0 else 0.0


def size_rounds(cfg, runner: str, startup_s: Optional[float] = None,
                fixed: Optional[int] = None) -> RoundSizing:
    """The round plan of ``cfg`` on ``runner``: by the rule, or ``fixed`` blocks per round if given."""
    from pipelines.run.plan import TrainingPlan
    blocks = TrainingPlan.from_config(cfg).num_blocks
    s = STARTUP_S[runner_kind(runner)] if startup_s is None else float(startup_s)
    c = estimate_block_s(cfg)
    n = min(fixed, blocks) if fixed else blocks_per_round(blocks, c, s)
    jobs = math.ceil(blocks / n)
    return RoundSizing(blocks, n, jobs, s, c, startup_share(jobs, blocks, c, s),
                       "--blocks_per_round" if fixed else "rule")


# --------------------------------------------------------------------------- the cost model
def _mlp_flops(sizes) -> float:
    """Forward FLOPs of one sample through dense layers ``sizes`` (input width left out: it is small)."""
    sizes = [int(h) for h in sizes]
    return 2.0 * sum(a * b for a, b in zip(sizes, sizes[1:]))


def _network_flops(agent) -> float:
    """Forward FLOPs of one sample through the agent's network(s), from the config alone."""
    torso = getattr(agent, "torso", None)
    if torso == "nature_cnn":
        flops, width = _NATURE_CNN_FLOPS, 512
    elif isinstance(torso, (list, tuple)) and torso:
        flops, width = _mlp_flops(torso), int(torso[-1])
    else:
        hidden = (getattr(agent, "hidden", None) or getattr(agent, "policy_hidden", None) or [])
        flops, width = _mlp_flops(hidden), int(hidden[-1]) if hidden else 64
    lstm = int(getattr(agent, "lstm_size", 0) or 0)
    if lstm:
        flops += 2.0 * 4 * (width + lstm) * lstm
        width = lstm
    flops += _mlp_flops([width, *(getattr(agent, "head", None) or [])])
    flops += _mlp_flops(getattr(agent, "critic_hidden", None) or [])
    return flops


def _env_step_s(env_id: str) -> float:
    """One env step's own cost by family (measured ranges; dm_control per physics step x its repeat)."""
    if env_id.startswith("dmc:"):
        repeat = int(env_id.split("repeat=", 1)[1].split("&")[0]) if "repeat=" in env_id else 1
        return 2e-4 * repeat
    if env_id.startswith("atari:"):
        return 4e-4
    if env_id.startswith("pixels:"):
        return 5e-5
    return 1e-5


def estimate_block_s(cfg) -> float:
    """Seconds one plan block takes in a round, before any is measured (actors, then learner: in order)::

        c = R (e + v / E + F / X_a + w)  +  r R (3 F N T / X_l + o)

    ``R`` rows a block, ``e`` an env step (:func:`_env_step_s`), ``E`` envs per actor, ``v`` a vector
    step's Python cost, ``F`` the network's forward FLOPs per sample (:func:`_network_flops`), ``w`` a
    row's write/commit/refresh share, ``r`` the replay ratio, ``N`` the batch, ``T`` the steps per sample
    (R2D2: sequence + burn-in; V-trace: the unroll), ``o`` a learner step's fixed cost; ``X_a`` and ``X_l``
    the effective FLOP rates. An order-of-magnitude figure: the first measured round replaces it.
    """
    from pipelines.run.plan import TrainingPlan
    agent = cfg.agent
    rows = TrainingPlan.from_config(cfg).block_rows
    flops = _network_flops(agent)
    envs = max(1, int(cfg.env.num_envs))
    actor = _env_step_s(cfg.env.id) + _VECTOR_STEP_S / envs + flops / _ACTOR_FLOPS + _ROW_S
    steps = (int(getattr(agent, "sequence_length", 0) or 0) + int(getattr(agent, "burn_in", 0) or 0)
             or int(getattr(agent, "unroll_length", 0) or 0) or 1)
    learner_step = 3 * flops * int(agent.batch_size) * steps / _LEARNER_FLOPS + _STEP_OVERHEAD_S
    return rows * actor + cfg.learner.replay_ratio * rows * learner_step


def describe(sizing: RoundSizing, runner: str) -> str:
    """The lines ``--show-rounds`` prints."""
    return (f"runner {runner}: {sizing.plan_blocks} plan blocks, {sizing.blocks_per_round} blocks per round "
            f"({sizing.chosen}), {sizing.jobs} job{'s' if sizing.jobs != 1 else ''}\n"
            f"estimated: {sizing.block_s:.2f} s a block (cost model), {sizing.startup_s:.0f} s a job start-up, "
            f"start-up share {100 * sizing.share:.1f}% of the run's wall time "
            f"(rule: <= {100 * TARGET_SHARE:.0f}% where the run allows, else one job)")
