"""Dataset statistics: episodes, steps, return distribution, per policy version and per actor.

Definitions (see ``episodes`` for complete episodes)::

    rows         stored rows (RLDS steps, incl. each episode's final observation row)
    transitions  rows that are not the last row of an episode (env steps taken)
    episodes     complete episodes; ``incomplete_episodes`` counts the rest
    return       distribution over complete episodes: mean, std (population), min,
                 p25, median, p75, max, and a histogram of ``bins`` equal bins over [min, max]
    per version  rows acted by each policy version; complete episodes (and their mean
                 return) attributed to the version of their first row
    per actor    the same, per actor

Example::

    with contextlib.closing(make_pass_executor("beam")) as engine:   # pipelines.executors.factory
        s = compute_stats(engine, "runs/a/replay")
    plot_returns(s, "returns.png")
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional

import numpy as np

from core.dataset import episodes, shards


def _group(keys: np.ndarray, values: np.ndarray, row_keys: np.ndarray, row_counts: np.ndarray,
           name: str) -> List[Dict[str, Any]]:
    """Per-key rows, complete episodes and mean return, sorted by key."""
    out = []
    for k in np.union1d(keys, row_keys):
        sel = keys == k
        out.append({name: int(k), "rows": int(row_counts[row_keys == k].sum()), "episodes": int(sel.sum()),
                    "mean_return": float(values[sel].mean()) if sel.any() else None})
    return out


def _distribution(returns: np.ndarray, bins: int) -> Dict[str, Any]:
    if not len(returns):
        return {"mean": None, "std": None, "min": None, "p25": None, "median": None, "p75": None,
                "max": None, "hist_counts": [], "hist_edges": []}
    lo, hi = float(returns.min()), float(returns.max())
    counts, edges = np.histogram(returns, bins=bins, range=(lo, hi) if hi > lo else (lo - 0.5, hi + 0.5))
    p25, median, p75 = np.percentile(returns, [25, 50, 75])
    return {"mean": float(returns.mean()), "std": float(returns.std()), "min": lo, "p25": float(p25),
            "median": float(median), "p75": float(p75), "max": hi,
            "hist_counts": [int(c) for c in counts], "hist_edges": [float(e) for e in edges]}


def summarize(parts: List[Dict[str, Any]], bins: int = 20) -> Dict[str, Any]:
    """Reduce function: per-shard segments -> the JSON-able statistics (module docstring)."""
    parts = episodes.ordered(parts)
    seg = episodes.all_segments(parts)
    table = episodes.episode_table(seg)
    done = table["complete"]
    returns, lengths = table["return"][done], table["rows"][done] - 1
    rows = int(sum(p["rows"] for p in parts))
    pv_keys = np.concatenate([p["rows_per_version"][0] for p in parts])
    pv_rows = np.concatenate([p["rows_per_version"][1] for p in parts])
    ac_keys = np.concatenate([p["rows_per_actor"][0] for p in parts])
    ac_rows = np.concatenate([p["rows_per_actor"][1] for p in parts])
    return {
        "shards": len(parts), "rows": rows, "transitions": rows - int(np.count_nonzero(seg["end"] != 0)),
        "episodes": int(done.sum()), "incomplete_episodes": int((~done).sum()),
        "episode_length": {"mean": float(lengths.mean()) if len(lengths) else None,
                           "min": int(lengths.min()) if len(lengths) else None,
                           "max": int(lengths.max()) if len(lengths) else None},
        "return": _distribution(returns, bins),
        "per_policy_version": _group(table["policy_version"][done], returns, pv_keys, pv_rows, "policy_version"),
        "per_actor": _group(table["actor"][done], returns, ac_keys, ac_rows, "actor"),
    }


def compute_stats(engine, store_url: str, version: Optional[int] = None, bins: int = 20) -> Dict[str, Any]:
    """Statistics of the store's snapshot at ``version`` (default latest), on ``engine``."""
    store, snap = shards.open_snapshot(store_url, version)
    result = engine.map_reduce("stats", episodes.shard_segments, shards.shard_items(store, snap),
                               functools.partial(summarize, bins=bins))
    return {"store": store.url, "version": snap.version, "env_id": store.env_id, **result}


def plot_returns(summary: Dict[str, Any], path: str) -> str:
    """Histogram of episode returns as a PNG (matplotlib Agg); returns ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dist = summary["return"]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    if dist["hist_counts"]:
        edges = np.asarray(dist["hist_edges"])
        ax.bar(edges[:-1], dist["hist_counts"], width=np.diff(edges), align="edge", edgecolor="black")
    ax.set_xlabel("episode return")
    ax.set_ylabel("episodes")
    ax.set_title(f"{summary['env_id'] or 'dataset'}: {summary['episodes']} episodes, v{summary['version']}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
