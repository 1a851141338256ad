"""The stage functions of a Beam round (:mod:`pipelines.beam.graph` chains them): State, RollOut,
Write, Commit, Learn, Evaluate, RoundEnd, and the run's close.

Each takes the run (:class:`BlockRun`: config, run directory, actor specs) and JSON records, so
each can be called, and tested, without a pipeline.

Every rule is the driver's (:mod:`pipelines.run.driver`): the block rules are the same functions
(:mod:`pipelines.run.block_rules`: commit metadata, GC cadence, version, evaluation and checkpoint
decisions), the rest comes from :mod:`pipelines.run.plan` (exploration by the block's planned env
steps, ``STOP_DELAY``) and :mod:`pipelines.run.evaluation_schedule` (seeds, best-version keeping).

Idempotent: every stage first looks for its own record
(:mod:`pipelines.beam.records`; Learn's and Evaluate's are written last,
Commit's just before its log entry, which a re-run completes) and returns
it, so a retried bundle or a re-run round changes nothing, and a shard is
never rewritten once its commit record exists.

Actor state: within a round, the ``ActorState`` objects themselves (the
round's blocks run in order in one worker, :mod:`pipelines.beam.graph`);
across rounds, ``core.actor_state`` documents (JSON data, never a pickle on
disk; ids and tasks read back are checked against the plan). Envs whose state
cannot be captured (native emulator or physics handles) are rebuilt from
seeds with a new incarnation at a round's start: fault-tolerant, not
bit-identical (larger rounds rebuild them less often).

Where Beam differs from the driver, on purpose: evaluations are numbered
(seeded) from block 0 of the plan, also after ``--resume`` (the driver
counts from 1 again when it resumes), so a resumed Beam run is
bit-identical to an uninterrupted one; a run's policy lag is reported in
versions only (``mean_policy_lag_s`` is 0: a round's stages share one
pipeline and no stage sees another's clock).
"""
from __future__ import annotations

import dataclasses
import os
import re
import socket
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from core import urls
from core.actor import ActorSpec
from pipelines.beam import policy_files
from pipelines.beam.records import (eval_digest, final_path, log_block_metrics, read_json, read_record,
                                    round_digest, round_path, write_json, write_record)
from pipelines.run import block_rules, stages
from pipelines.run.evaluation_schedule import decide_evaluation, evaluation_args
from pipelines.run.plan import TrainingPlan
from pipelines.run.task_stats import tasks_of


@dataclasses.dataclass(frozen=True)
class BlockRun:
    """What every stage of a run needs (small, picklable): config, run dir, actor specs."""
    cfg: Any
    run_dir: str
    actor_specs: Tuple[ActorSpec, ...]
    started_at: float = 0.0       # the launcher's process start (time to target counts from it)
    cpu_sink: str = ""            # stages record their process CPU here (core.stage_cpu)

    @property
    def plan(self) -> TrainingPlan:
        return TrainingPlan.from_config(self.cfg)

    @property
    def store_url(self) -> str:
        return urls.join(self.run_dir, "replay")

    def evaluations(self) -> Dict[int, int]:
        return block_rules.evaluation_blocks(self.plan, self.cfg.eval.every_env_steps)


def _version_of(state: Dict[str, Any]) -> int:
    """The policy version a stored state names, validated before it names a file."""
    v = state["loop"]["policy_version"]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"block {state.get('block')}: stored policy_version {v!r} is not a version (int >= 1)")
    return v


# --------------------------------------------------------------------------- start / load
def start_run(_: int, run: BlockRun) -> Dict[str, Any]:
    """State(-1): the store, version 1 of the initial network, the driver's initial counters."""
    done = read_record(run.run_dir, -1, "start")
    if done is not None:
        return done
    from core.replay import ReplayStore
    from pipelines.beam.learner import learner_for
    from pipelines.run.flight import LoopState
    cfg = run.cfg
    ReplayStore.open_or_create(run.store_url, env_id=cfg.env.id, **cfg.replay.writer_options())
    out = learner_for(cfg, run.run_dir).start()
    loop = LoopState(next_task=[0] * cfg.actors.num_actors, policy_version=1)
    return write_record(run.run_dir, -1, "start", {
        "block": -1, "loop": dataclasses.asdict(loop), "learner_steps": 0, "last_broadcast_step": 0,
        "last_ckpt_step": 0, "pending_evals": [], "stop": False, "published": out["published"]})


def load_state(block: int, run: BlockRun) -> Dict[str, Any]:
    """State(block) of an earlier round (or the start)."""
    if block < 0:
        return start_run(block, run)
    state = read_record(run.run_dir, block, "learn")
    if state is None:
        raise FileNotFoundError(f"learner block {block} has no record under {urls.join(run.run_dir, 'blocks')}")
    return state


# --------------------------------------------------------------------------- actors
def actor_doc_path(run_dir: str, actor: int, task: int) -> str:
    """Actor ``actor``'s state before task ``task`` (one file per round boundary: a re-run round reads its own)."""
    return urls.join(run_dir, "blocks", "actors", f"a{int(actor):04d}-t{int(task):08d}.json")


_ACTOR_DOC = re.compile(r"^a(\d{4})-t(\d{8})\.json$")


def _drop_older_docs(run_dir: str, actor: int, before_task: int) -> None:
    """Remove actor ``actor``'s documents of tasks before ``before_task`` (no round can need them again)."""
    fs, path = urls.resolve(urls.join(run_dir, "blocks", "actors"))
    for name in fs.ls(path, detail=False):
        m = _ACTOR_DOC.match(name.rsplit("/", 1)[-1])    # names read back are validated before use
        if m and int(m.group(1)) == actor and int(m.group(2)) < before_task:
            fs.rm(f"{path}/{m.group(0)}")


def load_actor(actor: int, first_block: int, run: BlockRun):
    """Actor ``actor``'s :class:`~core.actor.ActorState` before ``first_block``: fresh from seeds (block 0),
    else its stored document; None for envs that cannot be captured (rebuilt by :func:`roll_block`)."""
    from core.actor import ActorState
    spec = run.actor_specs[actor]
    task = first_block * run.plan.tasks_per_block
    if first_block == 0:
        return ActorState(spec, task)
    from core.actor_state import ActorStateError, loads, restore
    fs, path = urls.resolve(actor_doc_path(run.run_dir, actor, task))
    if not fs.exists(path):     # envs that cannot be captured (module docstring)
        return None
    with fs.open(path) as f:
        doc = loads(f.read())
    if doc.get("task") != task or doc.get("actor") != actor:
        raise ActorStateError(f"{actor_doc_path(run.run_dir, actor, task)} holds actor {doc.get('actor')!r} at task "
                              f"{doc.get('task')!r}, expected actor {actor} at task {task} (block {first_block})")
    return restore(spec, doc)


def _store_actor(run: BlockRun, actor: int, state, first_block: int) -> None:
    """The actor's state as a document (core.actor_state) for the next round; none for envs it cannot capture.

    Written once: a re-run round finds it (the same state, so nothing changes).
    """
    from core.actor_state import ActorStateUnsupported, capture, dumps
    fs, path = urls.resolve(actor_doc_path(run.run_dir, actor, state.next_task))
    if not fs.exists(path):
        try:
            text = dumps(capture(state))
        except ActorStateUnsupported:
            return
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(path + ".tmp", "w") as f:
            f.write(text)
        fs.mv(path + ".tmp", path)      # readers never see a partial document
    _drop_older_docs(run.run_dir, actor, first_block * run.plan.tasks_per_block)


def roll_block(actor: int, state, block: int, version_state: Dict[str, Any], run: BlockRun,
               first_of_round: int, last_of_round: bool) -> Tuple[Any, List[Any]]:
    """Actor ``actor``'s tasks of ``block`` from ``state`` (an ActorState, or None: rebuilt from seeds):
    ``(its state after them, [RolloutResult, ...])``.

    The state goes on to the actor's next block in the round's loop, in memory;
    after the round's last block it is also stored as a document for the next round.
    """
    from core.actor import ActorState
    from core.rollout import rollout
    if version_state["stop"]:
        return state, []      # planned past a stop: never committed
    plan, cfg = run.plan, run.cfg
    tasks = [k for a, k in plan.tasks(block) if a == actor]
    if state is None:         # cannot be captured: rebuilt from seeds
        state = ActorState(run.actor_specs[actor], tasks[0], incarnation=1)
    payload = policy_files.read_payload(policy_files.payload_path(run.run_dir, _version_of(version_state)))
    from core.agents.registry import get_builder
    # Exploration follows the plan's env steps (block start), as in pipelines.run.block_tasks.
    explore = get_builder(cfg.agent.algo).exploration(cfg.agent, block * plan.block_rows, actor)
    results = []
    for k in tasks:
        results.append(rollout(state, payload, k, cfg.actors.steps_per_task, explore))
        state.next_task = k + 1
    if last_of_round:
        _store_actor(run, actor, state, first_of_round)
    return state, results


def write_block(results: List[List[Any]], block: int, run: BlockRun) -> Optional[Dict[str, Any]]:
    """The block's results (actor-major, as the plan orders them) -> uncommitted shard ``s<block>``."""
    flat = sorted((r for rs in results for r in rs), key=lambda r: (r.stats.actor_id, r.stats.task_index))
    if not flat or read_record(run.run_dir, block, "commit") is not None:
        return None      # a stop, or committed already (a re-run round never rewrites a committed shard)
    return stages.write_shard_stage(run.store_url, stages.shard_id_for(block), flat,
                                    run.cfg.replay.writer_options())


# --------------------------------------------------------------------------- evaluations
def evaluate_block(state: Dict[str, Any], block: int, number: int, run: BlockRun) -> Optional[Dict[str, Any]]:
    """The run's ``number``-th evaluation, of the version State(block) names (the driver's seeds)."""
    done = read_record(run.run_dir, block, "eval")
    if done is not None or state["stop"]:
        return done
    cfg = run.cfg
    from core.agents.registry import get_builder
    payload = policy_files.read_payload(policy_files.payload_path(run.run_dir, _version_of(state)))
    selector = get_builder(cfg.agent.algo).action_selector
    result = stages.run_evaluation_task(payload, *evaluation_args(cfg, number, selector))
    return write_record(run.run_dir, block, "eval", result)


def _on_evaluation(run: BlockRun, loop, pending: List[Any]) -> Tuple[bool, Dict[str, Any]]:
    """The driver's ``_on_evaluation`` of one pending ``[block, version, env_steps, n]``: best, stop."""
    from pipelines.beam.learner import save_best
    block, _, env_steps, _ = pending
    result = read_record(run.run_dir, int(block), "eval")
    if result is None:
        raise FileNotFoundError(f"evaluation of block {block} has no record under {urls.join(run.run_dir, 'blocks')}")
    result = {**result, "env_steps": int(env_steps)}
    first = loop.time_to_target_s is None
    stop = decide_evaluation(run.cfg, loop, result, lambda version, r: save_best(run.cfg, run.run_dir, version, r))
    if first and loop.time_to_target_s is not None:     # from the launcher's start, not this worker's
        loop.time_to_target_s = time.time() - run.started_at
    return stop, result


# --------------------------------------------------------------------------- commit / learn
def commit_block(state: Dict[str, Any], block: int, info: Optional[Dict[str, Any]], _evaluated: Sequence[Any],
                 run: BlockRun) -> Dict[str, Any]:
    """The driver's ``_commit_next`` of ``block`` after State(block - 1); ``_evaluated``: ordering only.

    The record is written before the commit-log entry: a re-run then never
    rewrites the shard (Write<b> skips blocks with a record) and completes a
    commit a crash interrupted (an idempotent log append).
    """
    done = read_record(run.run_dir, block, "commit")
    if done is None:
        done = write_record(run.run_dir, block, "commit", _decide_commit(state, block, info, run))
    if done["commit"] is not None and done["commit"]["log_version"] is None:
        from core.replay import ReplayStore
        cfg = run.cfg
        store = ReplayStore.open(run.store_url, **cfg.replay.writer_options())
        log_version = stages.commit_stage(store, [done["commit"]["shard_id"]],
                                          meta=block_rules.commit_meta(block, done["commit"]["version"],
                                                                       done["commit"].get("episodes", 0)),
                                          retention_transitions=cfg.replay.retention_transitions)
        if block_rules.gc_due(log_version):
            stages.gc_stage(store, cfg.replay.gc_grace_s)
        done["commit"]["log_version"] = log_version
        write_record(run.run_dir, block, "commit", done)
    return done


def _decide_commit(state: Dict[str, Any], block: int, info: Optional[Dict[str, Any]],
                   run: BlockRun) -> Dict[str, Any]:
    """The evaluations due before ``block`` (best, stop) and, without a stop, its rows in the counters."""
    from pipelines.run.flight import LoopState
    plan, cfg = run.plan, run.cfg
    loop = LoopState(**state["loop"])
    pending, evaluated, stop = list(state["pending_evals"]), [], bool(state["stop"])
    while not stop and pending and pending[0][0] <= plan.decides_stop_before(block):
        decided, result = _on_evaluation(run, loop, pending.pop(0))
        stop |= decided
        evaluated.append(result)
    commit = None
    if not stop:
        if info is None:
            raise RuntimeError(f"block {block}: no shard was written for it")
        loop.env_steps += info["rows"]
        loop.shard_seq = block + 1
        loop.episodes += info.get("episodes", 0)
        loop.next_task = [(block + 1) * plan.tasks_per_block] * cfg.actors.num_actors
        commit = {**info, "log_version": None, "version": tasks_of(info)[0][5]}
    return {**state, "loop": dataclasses.asdict(loop), "pending_evals": pending, "stop": stop,
            "evaluated": evaluated, "commit": commit, "block": block - 1}


def learn_block(state: Dict[str, Any], block: int, run: BlockRun, save_state: bool = True) -> Dict[str, Any]:
    """The driver's ``_learn`` + ``_end_block`` of ``block``: train, version, evaluation, checkpoint.

    ``save_state``: store the learner's state after this block in ``beam/learner`` (a round does so
    after its last block only: :meth:`~pipelines.beam.learner.BlockLearner.learn`).
    """
    done = read_record(run.run_dir, block, "learn")
    if done is not None:
        return done
    out = {**state, "block": block, "published": None, "records": []}
    if state["stop"]:
        return write_record(run.run_dir, block, "learn", out)
    from pipelines.beam.learner import learner_for, records_json
    plan, cfg = run.plan, run.cfg
    loop = dict(state["loop"])
    t0 = time.time()
    learner = learner_for(cfg, run.run_dir)
    target = plan.learner_target(loop["env_steps"])
    due = block_rules.version_due(state["learner_steps"], target, state["last_broadcast_step"],
                                  cfg.actors.broadcast_period)
    learned = learner.learn(block, target, loop["policy_version"] + 1 if due else None, save_state)
    steps = learned["steps"]
    if learned["published"] is not None:
        out["published"], out["last_broadcast_step"] = learned["published"], steps
        loop["policy_version"] = learned["published"]["version"]
    number = run.evaluations().get(block)
    if number is not None:
        out["pending_evals"] = [*state["pending_evals"], [block, loop["policy_version"], loop["env_steps"], number]]
    loop["block"] = block + 1
    out.update(loop=loop, learner_steps=steps, records=records_json(learned["records"]),
               learn_s=time.time() - t0, worker=f"{socket.gethostname()} pid {os.getpid()}")
    if block_rules.checkpoint_due(steps, state["last_ckpt_step"], cfg.checkpoint.every_steps):
        out["last_ckpt_step"] = steps
        _checkpoint(run, learner, block, loop, out["pending_evals"], out["last_broadcast_step"])
    return write_record(run.run_dir, block, "learn", out)


def _checkpoint(run: BlockRun, learner, block: int, loop: Dict[str, Any], pending: List[Any],
                last_broadcast_step: int) -> None:
    """The driver's checkpoint after learner block ``block`` (``Trainer._checkpoint``), with what a resume
    needs of the plan as ``pipelines.run.resume.plan_state`` writes it: the versions the next
    ``policy_lag + 1`` blocks act with (State(policy_block(b)) names them), the undecided evaluations
    (their versions' parameters too), the evaluation count and threshold, the last version's step."""
    plan = run.plan
    versions = {}
    for b in range(block + 1, block + plan.policy_lag + 2):
        pb = plan.policy_block(b)
        versions[str(pb)] = int(loop["policy_version"]) if pb == block else _version_of(load_state(pb, run))
    n_evals, next_eval = block_rules.evaluation_state(plan, run.cfg.eval.every_env_steps, block)
    pending = [[int(x) for x in p] for p in pending]
    loop = {**loop, "versions": versions, "pending_evals": pending, "n_evals": n_evals, "next_eval": next_eval,
            "last_broadcast_step": int(last_broadcast_step)}
    evaluated = sorted({p[1] for p in pending})
    learner.checkpoint(block, loop, sorted({*versions.values(), *evaluated}), evaluated)


def finish_run(state: Dict[str, Any], run: BlockRun) -> Dict[str, Any]:
    """The driver's close: the remaining evaluations (best), a checkpoint, the final evaluation."""
    from pipelines.beam.learner import learner_for
    from pipelines.run.flight import LoopState
    block = int(state["loop"]["block"]) - 1
    done = read_json(final_path(run.run_dir))
    if done is not None and (done.get("block"), done.get("num_blocks")) == (block, run.plan.num_blocks):
        return done                  # a re-run round: closed already (a longer resumed run closes again)
    loop = LoopState(**state["loop"])
    evaluated = [_on_evaluation(run, loop, p)[1] for p in state["pending_evals"]]
    learner = learner_for(run.cfg, run.run_dir)
    _checkpoint(run, learner, block, dataclasses.asdict(loop), [], state["last_broadcast_step"])
    out = learner.finish(block, loop.best_version, loop.policy_version)
    # The launcher reads this: the summary's counters and final evaluation, nothing per block.
    loop_out = {k: v for k, v in dataclasses.asdict(loop).items() if k != "next_task"}
    final = {"final": out["final"], "learner_steps": out["steps"], "loop": loop_out,
             "evaluated": [eval_digest(r) for r in evaluated], "block": block, "num_blocks": run.plan.num_blocks}
    return write_json(final_path(run.run_dir), final)


def end_round(ran: Tuple[List[Dict[str, Any]], Dict[str, Any]], round_index: int, run: BlockRun) -> Dict[str, Any]:
    """rounds/r<round>.json (:func:`round_digest`) of the round's ``(states, timing)`` (``work_s``,
    ``learner_fixed_s``: :func:`pipelines.beam.graph.run_blocks`); the run's close after its last block
    (or a stop). Before them, the blocks' records go to ``metrics.jsonl`` from here, once per round
    (:func:`~pipelines.beam.records.log_block_metrics`; a crash between the two logs them again on
    --resume, as the driver re-logs the blocks it redoes)."""
    learned, timing = ran
    learned = sorted(learned, key=lambda s: s["block"])
    last = learned[-1]
    done = last["stop"] or last["block"] >= run.plan.num_blocks - 1
    if read_json(round_path(run.run_dir, round_index)) is None:   # a re-run round logged its blocks already
        log_block_metrics(run.run_dir, learned)
    if done:
        finish_run(last, run)
    digest = round_digest(round_index, learned, done)
    return write_json(round_path(run.run_dir, round_index), {**digest, **timing})
