"""core.report.aggregate: exact values on fixed numbers, each checked against an independent computation.

IQM against ``scipy.stats.trim_mean(..., 0.25)`` (what ``rliable.metrics.aggregate_iqm`` calls), the
probability of improvement against ``scipy.stats.mannwhitneyu``'s U / (n_x n_y) (as rliable computes it),
the stratified bootstrap against an explicit loop over the same documented draws with a hand-written
percentile, and pinned numbers so a change in any of them shows.
"""
import math

import numpy as np
import pytest
import scipy.stats

from core.report import aggregate as agg

#: 10 seeds x 1 task, the shape of a sweep's final returns for one setting
FINAL = [500.0, 480.0, 9.0, 500.0, 470.5, 312.0, 500.0, 455.0, 120.0, 498.0]
#: 5 seeds x 2 tasks
TWO_TASKS = [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0], [100.0, 5.0]]


def test_iqm_exact_and_equal_to_scipy_trim_mean():
    assert agg.iqm(np.arange(1, 9)) == 4.5                  # drop 1, 2 and 7, 8: mean(3, 4, 5, 6)
    assert agg.iqm([1, 2, 3, 4, 1000]) == 3.0               # floor(5/4) = 1 from each end
    # FINAL sorted: 9 120 | 312 455 470.5 480 498 500 | 500 500 -> mean of the middle six
    assert agg.iqm(FINAL) == pytest.approx((312 + 455 + 470.5 + 480 + 498 + 500) / 6, abs=1e-12)
    for data in (FINAL, TWO_TASKS, np.random.default_rng(3).normal(size=(7, 3))):
        assert agg.iqm(data) == pytest.approx(scipy.stats.trim_mean(np.asarray(data), 0.25, axis=None), abs=1e-12)


def _percentile(sorted_values, q):
    """numpy's default (linear) percentile, by hand."""
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, frac = int(math.floor(pos)), pos - math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def _independent_bootstrap(data, statistic, reps, seed):
    """The same draws as the documented order, resampled with explicit loops (runs within each task)."""
    a = np.asarray(data, dtype=float).reshape(len(data), -1)
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(reps):
        idx = rng.integers(0, a.shape[0], size=a.shape)
        sample = [[a[idx[n, m], m] for m in range(a.shape[1])] for n in range(a.shape[0])]
        values.append(statistic(np.array(sample)))
    values.sort()
    return _percentile(values, 2.5), _percentile(values, 97.5)


def test_stratified_bootstrap_ci_matches_an_independent_loop_and_is_pinned():
    point, lo, hi = agg.bootstrap_ci(FINAL, agg.iqm, reps=500, seed=0)
    ref = _independent_bootstrap(FINAL, lambda s: scipy.stats.trim_mean(s, 0.25, axis=None), 500, 0)
    assert (lo, hi) == pytest.approx(ref, abs=1e-9)
    assert point == agg.iqm(FINAL) and lo <= point <= hi
    assert (round(lo, 6), round(hi, 6)) == PINNED_FINAL
    # deterministic: same seed, same interval, bit for bit; another seed differs
    assert agg.bootstrap_ci(FINAL, agg.iqm, reps=500, seed=0) == (point, lo, hi)
    assert agg.bootstrap_ci(FINAL, agg.iqm, reps=500, seed=1) != (point, lo, hi)


def test_bootstrap_is_stratified_per_task():
    point, lo, hi = agg.bootstrap_ci(TWO_TASKS, agg.mean, reps=300, seed=5)
    ref = _independent_bootstrap(TWO_TASKS, np.mean, 300, 5)
    assert (lo, hi) == pytest.approx(ref, abs=1e-9)
    # a task whose runs all agree contributes no spread: constant columns give a zero-width interval
    const = [[3.0, 7.0]] * 4
    assert agg.bootstrap_ci(const, agg.iqm, reps=50, seed=0) == (5.0, 5.0, 5.0)


def test_probability_of_improvement_equals_mann_whitney_u_over_nm():
    x, y = [3.0, 5.0, 5.0, 9.0], [1.0, 5.0, 7.0]
    # pairs: 3>1; 5>1, 5=5; 5>1, 5=5; 9>1, 9>5, 9>7 -> 6 wins + 2 ties of 12 pairs
    assert agg.probability_of_improvement(x, y) == pytest.approx((6 + 0.5 * 2) / 12, abs=1e-15)
    u = scipy.stats.mannwhitneyu(x, y, alternative="greater").statistic
    assert agg.probability_of_improvement(x, y) == pytest.approx(u / (4 * 3), abs=1e-15)
    a, b = np.array(TWO_TASKS), np.array(TWO_TASKS)[::-1] + 0.5
    per_task = [scipy.stats.mannwhitneyu(a[:, m], b[:, m], alternative="greater").statistic / 25 for m in (0, 1)]
    assert agg.probability_of_improvement(a, b) == pytest.approx(np.mean(per_task), abs=1e-15)
    assert agg.probability_of_improvement(x, x) == 0.5


def test_probability_of_improvement_ci_is_deterministic_and_brackets_the_point():
    x, y = FINAL, [v - 50.0 for v in FINAL]
    p, lo, hi = agg.probability_of_improvement_ci(x, y, reps=400, seed=0)
    assert p == pytest.approx(scipy.stats.mannwhitneyu(x, y, alternative="greater").statistic / 100, abs=1e-15)
    assert lo <= p <= hi and 0.0 <= lo and hi <= 1.0
    assert agg.probability_of_improvement_ci(x, y, reps=400, seed=0) == (p, lo, hi)
    # independent: X's replicate is drawn first, then Y's, from one generator
    rng, values = np.random.default_rng(0), []
    ax, ay = np.asarray(x)[:, None], np.asarray(y)[:, None]
    for _ in range(400):
        rx = ax[rng.integers(0, 10, size=(10, 1))[:, 0], 0]
        ry = ay[rng.integers(0, 10, size=(10, 1))[:, 0], 0]
        values.append(scipy.stats.mannwhitneyu(rx, ry, alternative="greater").statistic / 100
                      if not np.array_equal(rx, ry) else 0.5)
    values.sort()
    assert (lo, hi) == pytest.approx((_percentile(values, 2.5), _percentile(values, 97.5)), abs=1e-12)


def test_performance_profile_fractions_above_tau():
    fractions = agg.performance_profile(FINAL, [0, 100, 475, 500])
    assert fractions.tolist() == [1.0, 0.9, 0.5, 0.0]      # strictly above: 500 is not above 500
    f, lo, hi = agg.performance_profile_ci(FINAL, [0, 475], reps=200, seed=0)
    assert f.tolist() == [1.0, 0.5] and lo[0] == hi[0] == 1.0 and lo[1] <= 0.5 <= hi[1]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="non-empty"):
        agg.iqm([])
    with pytest.raises(ValueError, match="same tasks"):
        agg.probability_of_improvement(TWO_TASKS, FINAL)
    with pytest.raises(ValueError, match="confidence"):
        agg.bootstrap_ci(FINAL, confidence=1.5, reps=10)


#: the 95% interval for FINAL's IQM, 500 replicates, seed 0 (pinned when written; the loop above agrees)
PINNED_FINAL = (278.333333, 496.333333)
