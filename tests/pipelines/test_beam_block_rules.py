"""The plan's block rules (pipelines.run.block_rules), which the driver and the Beam round both call:
commit metadata, GC cadence, version, evaluation and checkpoint decisions, with exact values
(evaluation_blocks on whole plans: tests/pipelines/test_beam.py::test_evaluation_blocks_follow_the_driver_rule)."""
import pytest

from pipelines.run import block_rules
from pipelines.run.block_rules import LearnEnd, learn_end


def test_commit_meta_names_version_block_and_episodes():
    assert block_rules.commit_meta(3, 2, 5) == {"policy_version": 2, "block": 3, "episodes": 5}
    assert block_rules.commit_meta(0, 1, 0) == {"policy_version": 1, "block": 0, "episodes": 0}


def test_gc_runs_after_every_hundredth_log_version():
    assert [v for v in range(1, 301) if block_rules.gc_due(v)] == [100, 200, 300]


@pytest.mark.parametrize("steps, target, last, period, due", [
    (0, 512, 0, 250, True),          # the first learner block of the default config: 512 steps
    (512, 1008, 512, 500, False),    # 496 steps since the last version
    (512, 1012, 512, 500, True),     # 500: exactly one period
    (1500, 1000, 1000, 500, True),   # the learner is ahead of the target: its own steps count
    (0, 0, 0, 250, False),           # no learner step yet (replay below min_size)
])
def test_version_due(steps, target, last, period, due):
    assert block_rules.version_due(steps, target, last, period) is due


def test_learn_end_evaluates_on_crossing_the_next_threshold_once_the_learner_stepped():
    # test_determinism's run after block 1: 2,048 rows, 1,008 learner steps, evaluations every 2,048 rows
    assert learn_end(2048, 1008, 2048, 0, 2048, 1000) == LearnEnd(True, 4096, True)
    assert learn_end(2047, 1008, 2048, 0, 2048, 1000) == LearnEnd(False, 2048, True)
    assert learn_end(4096, 0, 2048, 0, 2048, 1000) == LearnEnd(False, 2048, False)     # no learner step yet
    assert learn_end(10_000, 5, 4000, 0, 4000, 1000) == LearnEnd(True, 12_000, False)  # past two thresholds
    assert learn_end(3072, 1504, 4096, 1008, 2048, 500) == LearnEnd(False, 4096, False)   # 496 since the last
    assert learn_end(3072, 1508, 4096, 1008, 2048, 500) == LearnEnd(False, 4096, True)


def test_evaluation_state_after_each_block_is_what_the_driver_checkpoints():
    """(n_evals, next_eval) after each block of test_determinism's run (evaluations after blocks 1 and 3):
    the values its local checkpoints carry (tests/pipelines/test_beam_identity.py compares them)."""
    from core.config import load_config
    from pipelines.run.plan import TrainingPlan
    plan = TrainingPlan.from_config(load_config(overrides=["total_env_steps=4096", "eval.every_env_steps=2048"]))
    assert [block_rules.evaluation_state(plan, 2048, b) for b in range(4)] == [(0, 2048), (1, 4096), (1, 4096),
                                                                                (2, 6144)]
    late = TrainingPlan.from_config(load_config(overrides=["total_env_steps=4096", "replay.min_size=3000"]))
    assert block_rules.evaluation_blocks(late, 1024) == {2: 1, 3: 2}     # no learner step before 3,000 rows
    assert block_rules.evaluation_state(late, 1024, 1) == (0, 1024)      # 2,048 rows crossed, no step yet
