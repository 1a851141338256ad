"""The field's aggregate statistics over seeds (Agarwal et al., NeurIPS 2021, "Deep RL at the Edge of the
Statistical Precipice"; its library is ``rliable``): IQM, stratified bootstrap confidence intervals,
probability of improvement and performance profiles.

Scores are arrays of shape ``(runs, tasks)`` (a 1-D array is one task): ``scores[n, m]`` is run ``n``
(a seed) on task ``m``. Definitions, as ``rliable`` (``rliable.metrics`` / ``rliable.library``) has them:

* **IQM** (interquartile mean), the 25% trimmed mean of all ``N = runs * tasks`` scores: sort them, drop
  ``k = floor(0.25 N)`` from each end, average the rest,
  ``IQM = 1/(N - 2k) * sum_{i=k}^{N-k-1} x_(i)`` (``x_(i)`` sorted ascending). The same value as
  ``scipy.stats.trim_mean(scores, 0.25, axis=None)``, which ``rliable.metrics.aggregate_iqm`` calls.
* **Stratified bootstrap CI**: each replicate resamples the runs *within every task* (with replacement,
  ``runs`` draws per task), so each task keeps its number of runs; the statistic of each replicate is
  computed, and the CI is the percentile interval ``[q_{(1-c)/2}, q_{(1+c)/2}]`` of the replicates
  (``rliable.library.get_interval_estimates(..., method="percentile")``).
* **Probability of improvement** of X over Y: per task ``m``,
  ``P(X_m > Y_m) = 1/(n_x n_y) * sum_{i,j} [x_im > y_jm] + 0.5 [x_im == y_jm]`` (the Mann-Whitney U
  statistic over ``n_x n_y``), averaged over tasks; its CI resamples X and Y independently, each stratified.
* **Performance profile** (score distribution): ``F(tau) = 1/N * sum_{n,m} [scores[n, m] > tau]``, the
  fraction of runs scoring above ``tau``, with a stratified bootstrap band per ``tau``.

Implemented here with numpy alone, not with ``rliable``: ``rliable`` 1.2.0 ships as an sdist only and
pulls in ``arch`` (compiled), ``seaborn``, ``pandas`` and ``absl-py``, none of which the core install
needs, and its bootstrap draws from numpy's global ``RandomState``. These functions take a ``seed`` and
draw from their own ``numpy.random.default_rng(seed)``: the same scores and seed give the same interval,
bit for bit, in any process. (``scipy.stats.bootstrap`` does not stratify and scipy is not a core
dependency.) ``tests/core/test_aggregate.py`` checks each value against an independent computation
(``scipy.stats.trim_mean``, ``scipy.stats.mannwhitneyu``, an explicit loop over the same draws).

Example::

    final = np.array([[480.0], [500.0], [120.0], [500.0], [470.0]])    # 5 seeds x 1 task
    iqm(final)                                          # 483.33...: (470 + 480 + 500) / 3
    point, lo, hi = bootstrap_ci(final, iqm, seed=0)    # 95% stratified bootstrap CI
    p, p_lo, p_hi = probability_of_improvement_ci(int8_scores, fp32_scores, seed=0)
    fractions = performance_profile(final, taus=[100, 475])    # [1.0, 0.8]
"""
from __future__ import annotations

from typing import Callable, Sequence, Tuple

import numpy as np

#: bootstrap replicates used unless a caller says otherwise (rliable uses 50,000 for point CIs and
#: 2,000 for profiles; 2,000 keeps a sweep report's dozens of intervals well under a second)
DEFAULT_REPS = 2000


def as_scores(scores) -> np.ndarray:
    """``scores`` as a float array of shape ``(runs, tasks)`` (1-D input is one task); refuses empty input."""
    a = np.asarray(scores, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"scores must be a non-empty (runs, tasks) array, got shape {a.shape}")
    return a


def iqm(scores) -> float:
    """Interquartile mean of all scores: drop ``floor(N/4)`` from each end of the sorted ``N``, average the rest."""
    x = np.sort(as_scores(scores), axis=None)
    k = int(0.25 * x.size)
    return float(x[k:x.size - k].mean())


def median(scores) -> float:
    """Median of all scores."""
    return float(np.median(as_scores(scores)))


def mean(scores) -> float:
    """Mean of all scores."""
    return float(np.mean(as_scores(scores)))


def _resample(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One stratified replicate: ``runs`` draws with replacement inside each task (column)."""
    idx = rng.integers(0, a.shape[0], size=a.shape)
    return np.take_along_axis(a, idx, axis=0)


def _interval(values: np.ndarray, confidence: float) -> Tuple[float, float]:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    lo, hi = np.percentile(values, [50.0 * (1.0 - confidence), 50.0 * (1.0 + confidence)], axis=0)
    return lo, hi


def bootstrap_ci(scores, statistic: Callable[[np.ndarray], float] = iqm, reps: int = DEFAULT_REPS,
                 confidence: float = 0.95, seed: int = 0) -> Tuple[float, float, float]:
    """``(statistic(scores), lo, hi)``: the percentile CI of ``statistic`` over ``reps`` stratified replicates.

    Draw order (what makes it reproducible): replicate ``r`` takes ``rng.integers(0, runs, (runs, tasks))``
    from ``rng = numpy.random.default_rng(seed)``, the ``r``-th such call.
    """
    a = as_scores(scores)
    rng = np.random.default_rng(seed)
    values = np.array([statistic(_resample(a, rng)) for _ in range(int(reps))])
    lo, hi = _interval(values, confidence)
    return float(statistic(a)), float(lo), float(hi)


def probability_of_improvement(x, y) -> float:
    """``P(X > Y)`` per task (ties count one half), averaged over tasks; ``x`` and ``y``: ``(runs, tasks)``."""
    a, b = as_scores(x), as_scores(y)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"x and y must have the same tasks, got {a.shape[1]} and {b.shape[1]}")
    greater = (a[:, None, :] > b[None, :, :]).mean(axis=(0, 1))
    ties = (a[:, None, :] == b[None, :, :]).mean(axis=(0, 1))
    return float(np.mean(greater + 0.5 * ties))


def probability_of_improvement_ci(x, y, reps: int = DEFAULT_REPS, confidence: float = 0.95,
                                  seed: int = 0) -> Tuple[float, float, float]:
    """``(P(X > Y), lo, hi)``: X and Y resampled independently, each stratified; per replicate X's draw first."""
    a, b = as_scores(x), as_scores(y)
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(int(reps)):
        ra = _resample(a, rng)
        values.append(probability_of_improvement(ra, _resample(b, rng)))
    lo, hi = _interval(np.array(values), confidence)
    return probability_of_improvement(a, b), float(lo), float(hi)


def performance_profile(scores, taus: Sequence[float]) -> np.ndarray:
    """``F(tau)``: the fraction of all runs scoring strictly above each ``tau`` (rliable's score distribution)."""
    a = as_scores(scores)
    t = np.asarray(taus, dtype=np.float64)
    return (a.reshape(-1)[None, :] > t[:, None]).mean(axis=1)


def performance_profile_ci(scores, taus: Sequence[float], reps: int = DEFAULT_REPS, confidence: float = 0.95,
                           seed: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(F(taus), lo, hi)``, each of ``len(taus)``: one stratified replicate serves every ``tau``."""
    a = as_scores(scores)
    rng = np.random.default_rng(seed)
    values = np.array([performance_profile(_resample(a, rng), taus) for _ in range(int(reps))])
    lo, hi = _interval(values, confidence)
    return performance_profile(a, taus), np.asarray(lo), np.asarray(hi)
