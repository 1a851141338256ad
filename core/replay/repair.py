"""Repair a damaged commit log by truncating it after the last good version.

A damaged log (a missing entry, an entry that is not valid JSON or has the
wrong shape, an invalid shard id: ``LogDamagedError``) stops every reader, on
purpose: folding past the damage would silently give a shorter or wrong
history. The repair is to make version ``N`` (the last good one) the latest:

1. plan (writes nothing): entries ``1..N`` must read and fold cleanly;
   everything the log holds after ``N`` is listed for removal, together with
   the shard directories not committed at ``N`` (their data stays; ``gc``
   deletes it after its grace period, so the shards can still be inspected or
   recommitted with ``store.commit`` before then);
2. apply (``--yes``): the ``_last_checkpoint`` hint goes first if it points
   past ``N`` (so no reader starts from a checkpoint being removed), then log
   checkpoints newer than ``N``, then entries newest first; finally the hint
   is pointed at the newest remaining checkpoint, if any. Before deleting,
   the log is listed again: if it changed since the plan (a writer is
   running) nothing is deleted. Run the repair with no trainer or dataset
   job writing to the store.

Shard data is never touched, and model checkpoints (``<run>/checkpoints``)
are not part of the store: after truncating, ``--resume`` from a model
checkpoint that recorded a later replay version is not meaningful.

Example::

    plan = plan_truncate("runs/a/replay", after=1)
    print(describe(plan))            # what would be removed
    apply_truncate(plan)             # python -m pipelines.process repair STORE --truncate-after 1 --yes
"""
from __future__ import annotations

import dataclasses
import json
from typing import List, Optional

from core import urls
from core.replay.commit_log import LAST_CHECKPOINT, CommitLog, LogState, checkpoint_name, entry_name
from core.replay.schema import LogDamagedError, ReplayError, is_shard_id


@dataclasses.dataclass
class TruncatePlan:
    """What ``apply_truncate`` removes to make version ``after`` the latest."""

    store_url: str
    after: int
    latest: int                                   # newest entry file present
    entries: List[int]                            # entry versions to remove, newest first
    checkpoints: List[int]                        # log checkpoints to remove (versions > after)
    hint: Optional[int]                           # version _last_checkpoint names now (None: absent)
    new_hint: Optional[int]                       # newest checkpoint kept (None: remove the hint)
    uncommitted: List[str]                        # shard dirs not committed at `after` (left for gc)
    state: LogState                               # the state at `after`

    @property
    def changes(self) -> bool:
        return bool(self.entries or self.checkpoints or self.hint != self.new_hint)


def _listing(log: CommitLog):
    entries, checkpoints = log.listing()
    return entries, checkpoints, log.fs.exists(f"{log.path}/{LAST_CHECKPOINT}")


def _good_prefix(log: CommitLog, after: int) -> LogState:
    """The fold of entries 1..after; ReplayError if any of them is damaged."""
    state = LogState()
    for v in range(1, after + 1):
        try:
            entry = log._read_existing(v)
            state.apply(entry)
        except LogDamagedError as e:
            raise ReplayError(f"cannot truncate after version {after}: the log is already damaged at"
                              f" version {v} ({e.what}); valid: --truncate-after {v - 1} or lower") from None
    return state


def _uncommitted_dirs(store, state: LogState) -> List[str]:
    """Shard directories present under ``shards/`` that ``state`` does not know (left for gc)."""
    fs, path = store.writer.fs, store.writer.path
    try:
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in names if is_shard_id(n) and n not in state.infos)


def _read_hint(log: CommitLog) -> Optional[int]:
    try:
        return int(json.loads(log.fs.cat_file(f"{log.path}/{LAST_CHECKPOINT}"))["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def plan_truncate(store_url: str, after: int) -> TruncatePlan:
    """Plan the truncation of the store's log after version ``after``; writes nothing."""
    from core.replay.store import ReplayStore
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ReplayError(f"--truncate-after {after!r} invalid; valid: a version >= 0 (0 empties the log)")
    store = ReplayStore.open_unchecked(store_url)
    log = CommitLog(store.url, use_checkpoints=False)
    entries, checkpoints, has_hint = _listing(log)
    latest = entries[-1] if entries else 0
    if after > latest:
        raise ReplayError(f"--truncate-after {after} is past the newest entry of {store.url} ({latest});"
                          f" valid: 0..{latest}")
    state = _good_prefix(log, after)
    removed = sorted((v for v in entries if v > after), reverse=True)
    kept_ckpts = [c for c in checkpoints if c <= after]
    hint = _read_hint(log) if has_hint else None
    new_hint = kept_ckpts[-1] if kept_ckpts else None
    return TruncatePlan(store.url, after, latest, removed, [c for c in checkpoints if c > after],
                        hint if has_hint else None, new_hint, _uncommitted_dirs(store, state), state)


def describe(plan: TruncatePlan) -> List[str]:
    """Human-readable lines: what the plan keeps and removes."""
    state = plan.state
    lines = [f"store {plan.store_url}: keep versions 1..{plan.after} ({len(state.live)} live shards,"
             f" {state.rows:,} rows); newest entry present: {plan.latest}"]
    if not plan.changes:
        return lines + ["nothing to remove"]
    if plan.entries:
        lines.append(f"remove {len(plan.entries)} log entries: versions {_ranges(plan.entries)}")
    if plan.checkpoints:
        lines.append(f"remove log checkpoints: versions {', '.join(map(str, plan.checkpoints))}")
    if plan.hint != plan.new_hint:
        lines.append(f"{LAST_CHECKPOINT}: {plan.hint} -> {plan.new_hint if plan.new_hint is not None else 'removed'}")
    if plan.uncommitted:
        more = f", ... ({len(plan.uncommitted) - 8} more)" if len(plan.uncommitted) > 8 else ""
        lines.append(f"shard data not committed at version {plan.after} (kept; gc deletes it after its grace period): {', '.join(plan.uncommitted[:8])}{more}")
    return lines


def _ranges(versions: List[int]) -> str:
    v = sorted(versions)
    return f"{v[0]}..{v[-1]}" if v == list(range(v[0], v[-1] + 1)) else ", ".join(map(str, v))


def apply_truncate(plan: TruncatePlan) -> None:
    """Remove what ``plan`` lists (hint, newer checkpoints, entries newest first); see module docstring."""
    log = CommitLog(plan.store_url, use_checkpoints=False)
    entries, checkpoints, has_hint = _listing(log)
    now = (sorted((v for v in entries if v > plan.after), reverse=True), [c for c in checkpoints if c > plan.after])
    if now != (plan.entries, plan.checkpoints):
        raise ReplayError(f"the commit log of {plan.store_url} changed since the repair was planned (is a"
                          " writer running?); nothing was removed; stop writers and rerun")
    if has_hint and (plan.hint is None or plan.hint > plan.after):
        log.fs.rm_file(f"{log.path}/{LAST_CHECKPOINT}")
    for c in plan.checkpoints:
        log.fs.rm_file(f"{log.path}/{checkpoint_name(c)}")
    for v in plan.entries:  # newest first: an interrupted repair never opens a new gap
        log.fs.rm_file(f"{log.path}/{entry_name(v)}")
    if plan.new_hint is not None and plan.hint != plan.new_hint:
        urls.write_atomic(log.fs, f"{log.path}/{LAST_CHECKPOINT}",
                          json.dumps({"version": plan.new_hint}).encode())
