"""Relabel: add n-step return columns to every shard, swapped in one atomic log entry.

For row ``i`` that is not the last row of its episode, with ``d`` the number
of env steps from ``i`` to the episode's last row and ``k = min(n, d)`` (the
convention of ``core.replay.samplers``, Acme's ``NStepTransitionAdder``)::

    extras/nstep_return    R_i = r_i + g r_{i+1} + ... + g^{k-1} r_{i+k-1}
    extras/nstep_discount  D_i = g^k, or 0 if row i+k is terminated
    extras/nstep_count     k

so ``R_i + D_i * V(o_{i+k})`` is the n-step target; a truncated episode
bootstraps from its final observation (``D = g^k``). Last rows get
``R = 0, D = 0, k = 0`` (no transition starts there). A row whose window
runs past the stored data (the episode continues beyond the snapshot) gets
``R = D = NaN, k = -1``.

Episodes span shards, so it takes two passes:

1. ``shard_heads``: per shard, the first ``n`` rewards / flags of every
   continuation segment (``first_step > 0``) and the keys of its continuing
   tails; ``lookahead`` chains them (a short continuation may itself
   continue) into up to ``n`` successor rows per tail.
2. ``relabel_shard``: each shard's rows plus its tails' lookahead rows are
   linked by successor pointers and :func:`nstep_columns` computes the
   columns; the rows and the new columns are written as a new shard
   ``n<version:08d>-g<index:05d>``.

Then one ``replace`` entry swaps every old shard for its relabelled twin.

Example::

    relabel_store(engine, "data/expert", n_step=3, discount=0.99)
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from core.dataset import shards
from core.dataset.errors import DatasetError
from core.dataset.replace import infos_from_json, replace_shards

COLUMNS = ("extras/nstep_return", "extras/nstep_discount", "extras/nstep_count")


def nstep_columns(reward: np.ndarray, terminated: np.ndarray, last: np.ndarray, nxt: np.ndarray,
                  num_rows: int, n: int, gamma: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n-step return, discount and count (module docstring) for rows ``0..num_rows-1``.

    ``nxt[j]`` is the index of row ``j``'s successor in these arrays, or -1 if
    it is not available; ``last[j]`` marks an episode's last row.
    """
    pos = np.arange(num_rows)
    active = ~last[:num_rows]
    ret = np.zeros(num_rows, np.float64)
    k = np.zeros(num_rows, np.int32)
    missing = np.zeros(num_rows, bool)
    scale = 1.0
    for _ in range(n):
        ret += np.where(active, scale * reward[pos], 0.0)
        k += active
        step = nxt[pos]
        gap = active & (step < 0)
        missing |= gap
        active &= ~gap
        pos = np.where(active, step, pos)
        active &= ~last[pos]
        scale *= gamma
    starts = ~last[:num_rows]
    discount = np.where(starts & ~terminated[pos], np.power(gamma, k), 0.0)
    ret, discount, k = ret.astype(np.float32), discount.astype(np.float32), k.astype(np.int32)
    ret[missing], discount[missing], k[missing] = np.nan, np.nan, -1
    return ret, discount, k


def _key(episode_id: int, step: int) -> str:
    return f"{int(episode_id)}:{int(step)}"


def shard_heads(item: Dict[str, Any], n: int) -> Dict[str, Any]:
    """Map: continuation heads (first ``n`` rows) and continuing-tail keys of one shard."""
    r = shards.reader(item)
    seg = r.episodes()
    reward, term = r.read("reward"), r.read("terminated")
    last = term | r.read("truncated")
    heads = {}
    for e, s, lo, ln, end in zip(seg["episode_id"], seg["first_step"], seg["start"], seg["length"], seg["end"]):
        if s > 0:
            m = int(min(n, ln))
            heads[_key(e, s)] = {"reward": reward[lo:lo + m].tolist(), "terminated": term[lo:lo + m].tolist(),
                                 "last": last[lo:lo + m].tolist(), "length": int(ln), "end": int(end)}
    tails = [_key(e, s + ln) for e, s, ln, end in zip(seg["episode_id"], seg["first_step"], seg["length"],
                                                        seg["end"]) if end == 0]
    return {"index": item["index"], "shard_id": item["shard_id"], "heads": heads, "tails": tails}


def lookahead(parts: List[Dict[str, Any]], n: int) -> Dict[str, Dict[str, Any]]:
    """Reduce: per shard id, ``{tail key: up to n successor rows}`` (chained across segments)."""
    heads = {k: h for p in parts for k, h in p["heads"].items()}

    def chain(key: str) -> Optional[Dict[str, list]]:
        rows = {"reward": [], "terminated": [], "last": []}
        while key in heads and len(rows["reward"]) < n:
            h, take = heads[key], n - len(rows["reward"])
            for c in rows:
                rows[c] += h[c][:take]
            if h["end"] != 0 or len(rows["reward"]) >= n:
                break
            e, s = key.split(":")
            key = _key(int(e), int(s) + h["length"])
        return rows if rows["reward"] else None
    out = {}
    for p in sorted(parts, key=lambda p: p["index"]):
        out[p["shard_id"]] = {t: c for t in p["tails"] if (c := chain(t)) is not None}
    return out


def link_rows(rows: Dict[str, np.ndarray], seg: Dict[str, np.ndarray], look: Dict[str, Dict[str, list]]):
    """Shard rows + appended lookahead rows, with successor pointers; see :func:`nstep_columns`."""
    num = len(rows["reward"])
    reward, term = [rows["reward"].astype(np.float64)], [rows["terminated"]]
    last = [rows["terminated"] | rows["truncated"]]
    nxt = np.arange(1, num + 1, dtype=np.int64)
    nxt_extra: List[np.ndarray] = []
    tail_rows = seg["start"] + seg["length"] - 1
    nxt[tail_rows] = -1
    size = num
    for e, s, ln, t, end in zip(seg["episode_id"], seg["first_step"], seg["length"], tail_rows, seg["end"]):
        rowsx = look.get(_key(e, s + ln)) if end == 0 else None
        if rowsx is None:
            continue
        m = len(rowsx["reward"])
        nxt[t] = size
        reward.append(np.asarray(rowsx["reward"], np.float64))
        term.append(np.asarray(rowsx["terminated"], bool))
        last.append(np.asarray(rowsx["last"], bool))
        chain = np.arange(size + 1, size + m + 1, dtype=np.int64)
        chain[-1] = -1
        nxt_extra.append(chain)
        size += m
    return (np.concatenate(reward), np.concatenate(term), np.concatenate(last),
            np.concatenate([nxt, *nxt_extra]))


def relabel_shard(item: Dict[str, Any]) -> Dict[str, Any]:
    """Map: write the shard's rows plus the n-step columns as a new shard; returns its ShardInfo."""
    from core.replay import ReplayStore
    r = shards.reader(item)
    rows, attrs, seg = r.read_all(), r.attrs, r.episodes()
    reward, term, last, nxt = link_rows(rows, seg, item["lookahead"])
    ret, disc, k = nstep_columns(reward, term, last, nxt, len(rows["reward"]), item["n"], item["gamma"])
    rows.update({COLUMNS[0]: ret, COLUMNS[1]: disc, COLUMNS[2]: k})
    batches = shards.to_batches(rows, attrs)
    store = ReplayStore.open(item["store_url"])
    info = store.write_shard(item["new_id"], batches, attrs=shards.batches_attrs(
        batches, op="relabel", source_shard=item["shard_id"], n_step=item["n"], discount=item["gamma"]))
    return {"index": item["index"], "info": info.to_json()}


def _collect(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r["info"] for r in sorted(results, key=lambda r: r["index"])]


def relabel_store(engine, store_url: str, n_step: int, discount: float,
                  version: Optional[int] = None) -> Dict[str, Any]:
    """Add the n-step columns to every live shard of ``store_url``; one replace entry."""
    if n_step < 1 or not 0.0 <= discount <= 1.0:
        raise DatasetError(f"--n-step {n_step} --discount {discount} invalid; valid: n-step >= 1, 0 <= discount <= 1")
    store, snap = shards.open_snapshot(store_url, version)
    shards.check_reachable(engine, store.url)
    items = shards.shard_items(store, snap)
    look = engine.map_reduce("relabel-heads", functools.partial(shard_heads, n=n_step), items,
                             functools.partial(lookahead, n=n_step))
    work = [{**i, "new_id": f"n{snap.version:08d}-g{i['index']:05d}", "n": int(n_step), "gamma": float(discount),
             "lookahead": look[i["shard_id"]]} for i in items]
    infos = infos_from_json(engine.map_reduce("relabel", relabel_shard, work, _collect))
    version_after = replace_shards(store, [([s.id], [info]) for s, info in zip(snap.shards, infos)],
                                   reason="relabel", meta={"n_step": int(n_step), "discount": float(discount),
                                                           "from_version": snap.version})
    return {"store": store.url, "from_version": snap.version, "version": version_after,
            "shards": len(infos), "rows": snap.num_rows, "columns": list(COLUMNS)}
