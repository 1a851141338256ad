"""The learner as stages of Beam round pipelines: the plan's learner blocks, restored exactly.

The learner stages run on pipeline workers (a DirectRunner worker process, a
Dataflow worker), never in the launcher, so the launcher needs neither
TensorFlow nor an accelerator. They wrap the very
:class:`~pipelines.run.learner_stage.LearnerStage` that local and Dask runs use
(``learn_block``: the plan's calls, ``sampler_rng(b)``; versions quantized the
same way), and add what a worker that lives for one pipeline needs: the
learner's state at each round's end as durable data::

    start        build the learner from the seed -> version 1 (the initial network, as the driver)
                 -> beam/learner/ step 0 (state "after block -1")
    learn b      the in-memory learner holds block b-1's state (a round's blocks run in one
                 worker), else restore the newest saved state (params, target params, Adam slots,
                 step counter: exact), refill the replay cache in one read where that is exact,
                 and learn any blocks after it again from their records -> LearnerStage.learn_block
                 -> a new version? policies/v*.tflite + beam/versions/ (its parameters, for "best")
                 -> checkpoints/ when the driver's cadence says so
                 -> beam/learner/ step b+1 after the round's last block only
    save_best    beam/versions/<v> -> best/<v> (the parameters evaluated version v was made from)
    finish       checkpoint (the driver's last one), best parameters, final evaluation

Checkpoints (``checkpoints/``) have the driver's layout and plan state: the
payloads of the versions the next ``policy_lag + 1`` blocks act with and the
parameters of versions still being evaluated (``pipelines.run.resume``), so a
Beam run's checkpoint is the local run's, array for array.

One save per round, not per block: a round's fixed cost is then one import,
one restore, one cache refill and one save whatever its length
(``python -m benchmarks.micro.round_overhead --part learner`` measures it). A
round that fails part-way is retried from the last save: blocks whose
records exist are learned again, exactly (same calls, ``sampler_rng(b)``, the
cache refreshed to the same shards), and nothing they wrote is rewritten.
``beam/learner`` keeps the last two saves; ``beam/versions`` keeps
:data:`KEEP_VERSIONS` versions, more than a planned evaluation can lag
behind (``STOP_DELAY`` blocks, one version per block at most).

Example::

    learner = learner_for(cfg, run_dir)
    learner.start()                                   # a new run: version 1
    out = learner.learn(0, target=0, publish=None)    # {"steps", "published", "records"}
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

from core import config as config_lib
from core import urls
from pipelines.beam import policy_files

#: Version parameters kept for "best" (an evaluation is processed at most STOP_DELAY blocks later).
KEEP_VERSIONS = 8


def _checkpointer(run_dir: str, name: str, keep_last: int, cfg):
    from core.checkpoint import Checkpointer   # zarr + numpy: no TensorFlow
    return Checkpointer(urls.join(run_dir, *name.split("/")), keep_last=keep_last,
                        max_workers=cfg.checkpoint.write_threads)


def save_best(cfg, run_dir: str, version: int, result: Dict[str, Any]) -> None:
    """Copy version ``version``'s parameters to ``best/`` (the driver's ``save_best``; no TensorFlow)."""
    versions, best = (_checkpointer(run_dir, "beam/versions", KEEP_VERSIONS, cfg),
                      _checkpointer(run_dir, "best", 1, cfg))
    try:
        state, _ = versions.restore(int(version))
        best.save(int(version), {"params": state["params"]},
                  metadata={"eval": json.dumps(result), "config": config_lib.to_json(cfg)})
        best.wait()
    finally:
        versions.close()
        best.close()


class BlockLearner:
    """One run's :class:`~pipelines.run.learner_stage.LearnerStage` in a worker process (module docstring)."""

    def __init__(self, cfg, run_dir: str):
        t0 = time.perf_counter()
        from pipelines.run.learner_stage import LearnerStage
        self.cfg, self.run_dir = cfg, run_dir
        self.stage = LearnerStage(cfg, run_dir)
        self.chain = _checkpointer(run_dir, "beam/learner", 2, cfg)
        self.versions = _checkpointer(run_dir, "beam/versions", KEEP_VERSIONS, cfg)
        self.fixed_s = {"build": time.perf_counter() - t0, "restore": 0.0, "save": 0.0}   # a round's fixed cost
        self.at_block: Optional[int] = None     # the block whose end state the in-memory learner holds
        self.cache_block = -1                   # the last block whose shard this process's replay cache holds
        self.lock = threading.Lock()            # one stage call at a time (a multi-threaded worker)

    @property
    def steps(self) -> int:
        return self.stage.steps

    def _hold(self, block: int) -> None:
        """Make the learner hold its state after ``block`` (-1: the initial network).

        A worker that did not learn block ``block`` itself (a fresh process, or
        one that learned earlier blocks) restores the newest state ``beam/learner``
        holds at or before it (a round saves once, after its last block), brings
        its replay cache there (:meth:`_refill`), takes back a prioritized
        sampler's priorities, and learns the blocks after it again from their
        records (:meth:`_relearn`: only after a round failed part-way), so its
        next block samples what the uninterrupted learner would.
        """
        if self.at_block == block:
            return
        t0 = time.perf_counter()
        saved = max((s - 1 for s in self.chain.all_steps() if s - 1 <= block), default=None)
        if saved is None:
            raise RuntimeError(f"beam/learner holds no state at or before block {block} "
                               f"(steps {self.chain.all_steps()})")
        state, meta = self.chain.restore(saved + 1)
        if int(meta["block"]) != saved:
            raise RuntimeError(f"beam/learner step {saved + 1} holds block {meta['block']}, expected {saved}")
        if self.cache_block > saved:          # the cache is past this block: a fresh stage, rebuilt from the chain
            self.stage.close()
            from pipelines.run.learner_stage import LearnerStage
            self.stage, self.cache_block = LearnerStage(self.cfg, self.run_dir), -1
        self.stage.learner.restore(state["learner"])
        self._refill(saved)
        if "sampler" in state and hasattr(self.stage.sampler, "restore_priorities"):
            self.stage.sampler.restore_priorities(state["sampler"])
        self.at_block = saved
        self.fixed_s["restore"] += time.perf_counter() - t0     # restore + refill (relearning is learning)
        for b in range(saved + 1, block + 1):
            self._relearn(b)

    def _refill(self, block: int) -> None:
        """Bring the replay cache to the shards of blocks <= ``block``, as the uninterrupted learner's.

        One read (``LearnerStage.refresh_cache(block)``: the log as of block
        ``block``'s commit, whatever was committed since) when that is the same
        thing: every committed row fits in the cache and retention removed
        nothing (the ring then holds the shards in commit order, with the same
        row ids, slots and links); else one refresh per block
        (``pipelines.run.resume``), as the uninterrupted learner's blocks
        refreshed it.
        """
        cache, store = self.stage.cache, self.stage.store
        log = store.log.refresh()
        fits = sum(i.rows for i in log.live.values()) <= cache.max_transitions and cache.max_bytes is None
        if self.cache_block < 0 <= block and fits and not log.removed:
            self.stage.refresh_cache(block)
        else:
            for b in range(self.cache_block + 1, block + 1):
                self.stage.refresh_cache(b)
        self.cache_block = max(self.cache_block, block)

    def _relearn(self, block: int) -> None:
        """Learner block ``block`` again, as its record says it ran (a round that failed part-way)."""
        from pipelines.beam.records import read_record
        record = read_record(self.run_dir, block, "learn")
        if record is None:
            raise RuntimeError(f"beam/learner: block {block} has no learn record to learn it again from")
        if not record["stop"]:
            published = record.get("published")
            self.stage.learn_block(block, int(record["learner_steps"]),
                                   published["version"] if published else None, keep=[])
            self.cache_block = block
        self.at_block = block

    def _save(self, block: int) -> None:
        t0 = time.perf_counter()
        tree = {"learner": self.stage.learner.state()}
        if hasattr(self.stage.sampler, "priority_state"):     # prioritized replay: priorities, row ids, max
            tree["sampler"] = self.stage.sampler.priority_state()
        self.chain.save(block + 1, tree, metadata={"block": block})
        self.chain.wait()     # the next round may restore it in another process
        self.at_block = block
        self.fixed_s["save"] += time.perf_counter() - t0

    def take_fixed_seconds(self) -> Dict[str, float]:
        """Seconds of fixed cost since the last call (build: TensorFlow import and learner build; restore:
        state restore and cache refill; save), for the round record; then zero."""
        out = {k: round(v, 3) for k, v in self.fixed_s.items()}
        self.fixed_s = dict.fromkeys(self.fixed_s, 0.0)
        return out

    def _publish(self, out: Dict[str, Any]) -> None:
        """Write a version the stage made: flatbuffer for actors, parameters for ``best``."""
        version = out["published"]["version"]
        self.versions.save(version, {"params": self.stage.version_params[version]})
        self.versions.wait()
        policy_files.write_payload(self.run_dir, self.stage.payload(version))

    def start(self) -> Dict[str, Any]:
        """A new run: version 1 from the initial network (the driver's first ``new_version``)."""
        with self.lock:
            out = self.stage.new_version(1, keep=[])
            self._publish(out)
            self._save(-1)
            return out

    def learn(self, block: int, target: int, publish: Optional[int], save: bool = True) -> Dict[str, Any]:
        """Learner block ``block`` (``LearnerStage.learn_block``) from block ``block - 1``'s exact state;
        ``save``: then store the state in ``beam/learner`` (a round's last block: once per round)."""
        with self.lock:
            self._hold(block - 1)
            self.at_block = None              # mid-block: a failure leaves no claim on the state
            out = self.stage.learn_block(block, target, publish, keep=[])
            self.cache_block = block              # learn_block refreshed the cache to this block's shard
            if out["published"] is not None:
                self._publish(out)
            if save:
                self._save(block)
            self.at_block = block
            return out

    def checkpoint(self, block: int, loop: Dict[str, Any], versions: Sequence[int] = (),
                   params_of: Sequence[int] = ()) -> None:
        """The driver's checkpoint (``checkpoints/``) of the state after ``block``, in the driver's layout:
        with the payloads of ``versions`` and the parameters of ``params_of`` (``LearnerStage.checkpoint``),
        read from ``policies/`` and ``beam/versions`` where this worker's stage no longer holds them."""
        with self.lock:
            self._hold(block)
            added = []      # (table, version) lent to the stage for this checkpoint only
            for v in versions:
                if v not in self.stage.payloads:
                    self.stage.payloads[v] = policy_files.read_payload(policy_files.payload_path(self.run_dir, v))
                    added.append((self.stage.payloads, v))
            for v in params_of:
                if v not in self.stage.version_params:
                    self.stage.version_params[v] = self.versions.restore(int(v))[0]["params"]
                    added.append((self.stage.version_params, v))
            try:
                self.stage.checkpoint(json.dumps(loop), list(versions), list(params_of))
                self.stage.wait_checkpoints()
            finally:
                for table, v in added:
                    table.pop(v, None)

    def finish(self, block: int, best_version: int, policy_version: int) -> Dict[str, Any]:
        """The final evaluation of the best (else latest) parameters (``LearnerStage.finish``)."""
        with self.lock:
            self._hold(block)
            self.at_block = None              # finish loads the best parameters into the learner
            return self.stage.finish(best_version, policy_version)


_LEARNERS: Dict[Any, BlockLearner] = {}
_LEARNERS_LOCK = threading.Lock()


def learner_for(cfg, run_dir: str) -> BlockLearner:
    """This process's learner for ``(cfg, run_dir)`` (one at a time: a new run closes the old one)."""
    key = (run_dir, config_lib.to_json(cfg))
    with _LEARNERS_LOCK:
        learner = _LEARNERS.get(key)
        if learner is None:
            _forget()
            learner = _LEARNERS[key] = BlockLearner(cfg, run_dir)
        return learner


def _forget() -> None:
    for old in _LEARNERS.values():
        old.stage.close()
    _LEARNERS.clear()


def forget_learners() -> None:
    """Close and drop this process's learner: the next block builds it and restores its state from
    ``beam/learner``, as in a new worker process (a warm worker between rounds,
    :mod:`pipelines.beam.warm_workers`)."""
    with _LEARNERS_LOCK:
        _forget()


def take_fixed_seconds(cfg, run_dir: str) -> Dict[str, float]:
    """:meth:`BlockLearner.take_fixed_seconds` of this process's learner for the run (zeros if none: a
    round that found every block's record builds no learner)."""
    with _LEARNERS_LOCK:
        learner = _LEARNERS.get((run_dir, config_lib.to_json(cfg)))
    return learner.take_fixed_seconds() if learner is not None else {"build": 0.0, "restore": 0.0, "save": 0.0}


def records_json(records: List[Any]) -> List[List[Any]]:
    """The stage's metrics records as JSON-able ``[kind, step, fields]`` triples."""
    return [[kind, int(step), fields] for kind, step, fields in records]
