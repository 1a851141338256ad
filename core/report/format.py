"""Helpers both reports share: a band of curves on one grid, table cells and file-name slugs.

Curves: each seed's evaluation returns are interpolated (linearly, held
flat after its last evaluation) onto a common grid of wall-clock seconds or
env steps, from the first evaluation of any seed to the last; the plots show
the mean (ActorQ study) or median (learning suite) across seeds and a
min-max band.

Example::

    grid, mid, lo, hi = band_on_grid([np.array([0., 10.])], [np.array([0., 5.])], points=3)
    # grid [0, 5, 10], mid [0, 2.5, 5]
    _fmt(None, ".1f")          # "-"  (not measured / no median)
    _slug("CartPole-v1 dqn")   # "cartpole-v1-dqn"
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np


def _fmt(v: Optional[float], spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-").lower()


def band_on_grid(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], points: int = 100,
                 center: str = "mean") -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(grid, center, lo, hi)`` of curves ``(xs[i], ys[i])`` resampled on one grid.

    The grid spans the first x of any curve to the last x of any curve in
    ``points`` even steps. Each curve is interpolated linearly and held flat
    outside its own range (``np.interp``): a run that stopped at its target
    keeps its last return. ``center`` is ``"mean"`` or ``"median"`` across
    curves at each grid point; ``lo`` / ``hi`` are the min and max.
    """
    grid = np.linspace(min(v.min() for v in xs), max(v.max() for v in xs), points)
    vals = np.stack([np.interp(grid, xv, yv) for xv, yv in zip(xs, ys)])
    mid = np.median(vals, 0) if center == "median" else vals.mean(0)
    return grid, mid, vals.min(0), vals.max(0)
