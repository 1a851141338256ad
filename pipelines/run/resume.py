"""What ``--resume`` needs beyond the learner's checkpoint, so a resumed run ends bit-identical.

A run killed after a checkpoint and resumed must follow its plan
(:mod:`pipelines.run.plan`) exactly as if it had never stopped. Four kinds of
state make that possible, each stored where it becomes durable together with
what it describes::

    checkpoint (LoopState + arrays)  the policy versions the next policy_lag + 1 blocks act with
                                     (payload bytes), the evaluations still undecided (block,
                                     version, env steps, seed index; their versions' parameters),
                                     the evaluation and broadcast cadence       -> plan_state
    checkpoint (sampler/ arrays)     a prioritized sampler's priorities, their row ids and the max
                                     priority, restored onto the rebuilt cache  -> restore_priorities
    replay shard s{b} (attrs)        every actor's env state after block b (core.actor_state,
                                     written by the block's shard write)        -> load_actor_states
    commit log entry of s{b} (meta)  the episodes that ended in block b         -> committed_episodes
    commit log                       the learner's replay cache, rebuilt refresh by refresh as the
                                     uninterrupted run's learner blocks refreshed it -> replay_cache

The actor states live in the shards, not in the checkpoint: blocks committed
after the checkpoint (a kill between a commit and the next checkpoint) are
never run again, and the actors continue after the last committed block.
Envs whose state cannot be captured (``ActorStateUnsupported``: Atari,
dm_control) are rebuilt from seeds at the first block after the resume, as
before: such a resume is *fault-tolerant but not bit-identical*, and the
``resume`` record of ``metrics.jsonl`` says so.

Example::

    versions, params_of = plan_state(trainer.loop, flight, trainer.n_evals)   # at a checkpoint
    resumed = load_actor_states(store, actor_specs, first_block)              # at --resume
    resumed.states          # {actor: StoredState} for the actors that continue exactly
    resumed.record(loop, precommitted, versions)   # the "resume" metrics record
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Sequence, Tuple

from core.config import ConfigError
from pipelines.run.stages import actor_states, shard_id_for, state_text


def plan_state(loop, f, n_evals: int) -> Tuple[List[int], List[int]]:
    """Write into ``loop`` what the blocks after this checkpoint need; returns (versions, params_of).

    ``versions``: the versions whose payloads the checkpoint must carry (the
    next ``policy_lag + 1`` blocks' and the undecided evaluations');
    ``params_of``: those whose parameters it must carry (evaluated ones: the
    best checkpoint is saved from them).
    """
    plan = f.plan
    # Blocks in flight hold their version (block_ref); the others get theirs when submitted (version_for).
    planned = {plan.policy_block(b): f.block_ref.get(b) or f.version_for(b)
               for b in range(loop.block, loop.block + plan.policy_lag + 1)}
    loop.versions = {str(pb): int(ref[1]) for pb, ref in planned.items() if ref is not None}
    loop.pending_evals = [[int(b), int(f.eval_meta[fut][0]), int(steps), int(f.eval_meta[fut][1])]
                          for b, fut, steps in f.evals]
    loop.n_evals, loop.next_eval, loop.last_broadcast_step = int(n_evals), int(f.next_eval), int(f.last_broadcast_step)
    evaluated = sorted({e[1] for e in loop.pending_evals})
    return sorted({*loop.versions.values(), *evaluated}), evaluated


def committed_episodes(store, shard_id: str) -> int:
    """Episodes that ended in a committed block (its commit entry's ``meta``; 0 for logs from before)."""
    version = store.log.refresh().committed_version.get(shard_id)
    if version is None:
        return 0
    return int((store.log.entry(version).get("meta") or {}).get("episodes", 0))


@dataclasses.dataclass
class Resumed:
    """The actors' states a resumed run continues from (see module docstring)."""
    shard_id: str | None                                           # where they were read (None: block 0)
    states: Dict[int, Any] = dataclasses.field(default_factory=dict)          # actor -> StoredState
    rebuilt: Dict[int, str] = dataclasses.field(default_factory=dict)         # actor -> why (from seeds)

    def record(self, loop, precommitted: Dict[int, int], versions: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
        """The ``resume`` metrics record: where the run continues and whether it stays bit-identical."""
        return {"block": loop.block, "precommitted_blocks": sorted(precommitted), "actor_states_from": self.shard_id,
                "actors_restored": sorted(self.states), "actors_rebuilt": {str(a): w for a, w in self.rebuilt.items()},
                "versions_restored": [int(v["version"]) for v in versions],
                "bit_identical": not self.rebuilt and bool(versions),
                "note": ("" if not self.rebuilt else "these actors' envs cannot be captured: rebuilt from seeds, "
                         "fault-tolerant but not bit-identical")}


def _config_change(doc: Dict[str, Any], spec: Any, first_task: int) -> str:
    """Why ``doc`` cannot fit ``spec`` because the config changed (env, envs, plan), or ""."""
    for key, want in (("env_id", spec.env_id), ("num_envs", spec.num_envs), ("task", first_task)):
        if key in doc and doc[key] != want:
            return f"the config changed since the state was stored ({key} {doc[key]!r}, now {want!r})"
    return ""


def load_actor_states(store, specs: Sequence[Any], first_block: int) -> Resumed:
    """The actors' states after block ``first_block - 1``, validated against ``specs``.

    A damaged document is a one-line ConfigError naming the shard (nothing
    is written before it: the driver calls this before the run's first write).
    Documents that no longer fit because ``--set`` changed the env, the envs
    per actor or the plan's tasks are not damage: those actors are rebuilt.
    """
    from core.actor_state import ActorStateError, loads, restore
    from core.rollout import StoredState
    if first_block <= 0:    # nothing committed: actors start from seeds, as the uninterrupted run did
        return Resumed(None)
    sid = shard_id_for(first_block - 1)
    docs = actor_states(store, sid)
    first_task = specs[0].first_task if specs else 0
    out = Resumed(sid)
    for spec in specs:
        a = spec.actor_id
        stored = docs.get(str(a))
        if stored is None or (isinstance(stored, dict) and "unsupported" in stored):
            out.rebuilt[a] = stored["unsupported"] if stored else f"replay shard {sid} holds no state of actor {a}"
            continue
        try:
            doc = loads(state_text(stored))
            changed = _config_change(doc, spec, first_task)
            if changed:      # --set changed the actors since: a new plan, so no stored state fits it
                out.rebuilt[a] = changed
                continue
            restore(spec, doc).envs.close()       # the full check: env id, actor, structure, dtypes, shapes
        except (ActorStateError, ValueError) as e:
            raise ConfigError(f"--resume: replay shard {sid} holds a damaged state of actor {a} ({e}); "
                              "valid: the shard as this run wrote it, or a new --run-dir") from None
        out.states[a] = StoredState(doc)
    return out


# -- the learner's replay cache, as the plan fills it ---------------------------------------------

def refresh_cache(cache, store, block: int) -> None:
    """Refresh ``cache`` to the shards of blocks <= ``block`` (the plan's), whatever was committed since.

    Only a resumed run finds block ``block + 1`` committed already (a kill
    between a commit and the next checkpoint): the cache then stops at the
    log version just before it, where the uninterrupted run's stopped.
    """
    nxt = store.log.refresh().committed_version.get(shard_id_for(block + 1))
    if nxt is None:
        cache.refresh()
    else:
        _refresh_to(cache, store, nxt - 1)


def replay_cache(cache, store, blocks, log_version) -> None:
    """Refresh ``cache`` block by block, as learner blocks ``0 .. blocks-1`` refreshed it.

    The ring's row ids and slots then match the uninterrupted run's, which a
    single refresh of every committed shard would not once the cache
    overflows (it skips shards that would be evicted at once). A run whose
    retention removed shards (their data may be gone) is loaded at once, up
    to the checkpoint's log version: not bit-identical once the cache overflows.
    """
    if blocks is None or store.log.refresh().removed:
        _refresh_to(cache, store, log_version if log_version is not None else store.latest_version())
        return
    for b in range(int(blocks)):
        refresh_cache(cache, store, b)


def _refresh_to(cache, store, version: int) -> None:
    cache.store = _LogPrefix(store, version)
    try:
        cache.refresh()
    finally:
        cache.store = store


class _LogPrefix:
    """``store`` as a cache sees it when its commit log reads as of ``version`` (``cache.store.log.state()``)."""

    def __init__(self, store, version: int):
        self._store, self._version = store, version

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @property
    def log(self) -> "_LogPrefix":
        return self

    def state(self, version=None):
        return self._store.log.state(self._version if version is None else version)
