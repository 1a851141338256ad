"""The learner roof's FLOP count: exact for the networks the learner speed benchmark puts beside it."""
import pytest

from benchmarks.micro.learner_roof import dqn_step_flops


def test_dqn_step_flops_counts_three_forwards_weight_grads_and_input_grads_past_the_first_layer():
    # [4 -> 256 -> 256 -> 2], batch 64: F = 1,024 + 65,536 + 512 = 67,072 multiply-adds a row
    per_row, first = 67_072, 1_024
    assert dqn_step_flops(4, (256, 256), 2, 64) == 2 * 64 * (5 * per_row - first) == 42_795_008
    # one hidden layer [3 -> 5 -> 2], batch 1: F = 15 + 10 = 25; 2 * (125 - 15) = 220
    assert dqn_step_flops(3, (5,), 2, 1) == 220


def test_matmul_rate_is_positive_and_finite_for_a_tiny_chain():
    pytest.importorskip("tensorflow")
    from benchmarks.micro.learner_roof import matmul_gflops
    rate = matmul_gflops(batch=4, width=8, chain=4, seconds=0.01)
    assert 0 < rate < 1e6
