"""The actor loop: ``num_envs`` vectorized envs x a LiteRT policy -> TrajectoryBatch.

A rollout task steps the envs of one actor for ``num_steps`` vector steps
with the (quantized) policy it was given and returns a
:class:`~core.trajectory.TrajectoryBatch` plus small stats. Actors hold env
state between tasks, in a registry local to the worker process, so that
episodes continue across tasks (and therefore across replay shards).

Retries are harmless: everything a task produces is a deterministic function
of ``(seed, actor_id, task_index)`` and the actor's env state. An actor is
built from seeds at its ``ActorSpec.first_task`` (0, or where a resumed run
starts it); an episode started in task ``k`` gets the counter ``(k << 10) | i``
(see :func:`core.trajectory.make_episode_id`).

Env state as data: every result carries ``next_state``, the actor's state
after the task (envs, observations, episode bookkeeping, recurrent carry, frame stack;
everything but the LiteRT interpreter). It is pickled only when the result
leaves its process (a Dask transfer), in memory, never to disk: a snapshot
costs ~2 ms, 13% of a CartPole task, so results that stay on their worker do
not pay it. An executor passes the actor's previous result to its next task
(``after=``), so a task that runs on a worker that does not hold the actor
(Dask moved or stole it) continues from that state, bit-identically.

After a lost worker, Dask recomputes lost results from their dependency
chain (back to the actor's first task if need be), so the run usually stays
bit-identical: a worker of a real 2-worker cluster SIGKILLed after the first
commit left parameters and replay identical to a local run in 13 of 14 trials
(``tests/pipelines/test_determinism.py::test_a_real_cluster_that_loses_a_worker_is_identical_or_the_documented_exception``
asserts identity, or this exception where a committed episode id carries the
incarnation bit). Fault tolerance,
not bit-identity, when the state is gone: a task whose predecessor's result
Dask forgot, whose only surviving copy was pickled after the actor had moved
on (a shard writer's replica: it carries no state), or whose envs cannot be
pickled, rebuilds the actor from seeds at that task and plays *new* episodes. Their stream ids carry an
incarnation bit (bit 21), so they never reuse the ids of the lost actor's
episodes, some of which may already be committed. The rebuild is itself
deterministic (seeds from ``(seed, actor, task)``). Such a run stays complete
and consistent, but is not bit-identical to an undisturbed one. (Losing the
*rebuilt* actor's output of the same task again, after part of it was
committed, would reuse its ids: two losses of one task, not guarded.)

Env state on disk, for ``--resume``: a task asked with ``capture_state=True``
(the driver asks an actor's last task of each plan block) also returns
:func:`core.actor_state.capture` of the state it leaves, a small JSON document
(no pickle) that the shard writer stores in the block's shard, so it becomes
visible exactly when the shard is committed. A resumed run hands each actor's
document back as ``after=StoredState(doc)``, and the actor continues its
episodes bit-identically. Envs whose state ``capture`` refuses
(``ActorStateUnsupported``: Atari's ALE, MuJoCo/dm_control physics) store
``{"unsupported": reason}`` instead; a resumed run rebuilds those actors from
seeds at their first task after the resume: *fault-tolerant but not
bit-identical*.

The actor itself (:class:`~core.actor.ActorSpec`, :class:`~core.actor.ActorState`
and how its state travels) is :mod:`core.actor`.

Example::

    spec = ActorSpec(run_id="r", env_id="CartPole-v1", num_envs=8, seed=0, actor_id=0)
    result = run_rollout_task(spec, payload, task_index=0, num_steps=32, explore={"epsilon": 0.1})
    result.batch.reward.shape   # (32, 8)
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from core.actor import ActorSpec, ActorState, LiveState
from core.trajectory import TrajectoryBatch, make_episode_id, step_buffer

#: Episodes an env may start within one task before ids could collide.
_EPISODES_PER_TASK = 1 << 10

@dataclasses.dataclass
class RolloutStats:
    actor_id: int
    task_index: int
    env_steps: int
    policy_version: int
    episode_returns: List[float]
    episode_lengths: List[int]
    seconds: float
    inference_seconds: float
    worker: str


@dataclasses.dataclass
class RolloutResult:
    batch: TrajectoryBatch
    stats: RolloutStats
    next_state: Optional["LiveState"] = None    # the actor's state after the task (module docstring)
    actor_state: Optional[Dict[str, Any]] = None   # capture_state=True: its document (module docstring)

def rollout(state: ActorState, payload, task_index: int, num_steps: int,
            explore: Dict[str, float]) -> RolloutResult:
    """Step ``state``'s envs for ``num_steps`` with ``payload``'s policy and selector params ``explore``."""
    spec = state.spec
    state.set_policy(payload)
    rng = np.random.default_rng([spec.seed, spec.actor_id, task_index, 1])
    e, t = spec.num_envs, num_steps
    # [T, E] buffers stored env-major: the order shards store rows in (trajectory.step_buffer).
    obs_buf = step_buffer(t, e, state.obs.shape[1:], state.obs.dtype)
    act_buf: Optional[np.ndarray] = None
    extras: Dict[str, np.ndarray] = {}
    rew_buf = step_buffer(t, e, (), np.float32, fill=0)
    term_buf = step_buffer(t, e, (), bool, fill=False)
    trunc_buf = step_buffer(t, e, (), bool, fill=False)
    ep_buf = step_buffer(t, e, (), np.int64, fill=0)
    step_buf = step_buffer(t, e, (), np.int32, fill=0)
    returns: List[float] = []
    lengths: List[int] = []
    if state.counted_task != task_index:
        state.started_in_task[:] = 0
        state.counted_task = task_index
    infer_s = 0.0
    start = time.perf_counter()
    for i in range(t):
        obs = state.obs
        last = state.obs_terminated | state.obs_truncated
        t0 = time.perf_counter()
        if state.stacker is not None:   # stacked like the inference server stacks (step 0: a new episode)
            obs_in = state.stacker(obs, state.step == 0)
        else:
            obs_in = obs
        x = obs_in.reshape(e, -1).astype(np.float32, copy=False)
        if state.carry is None:
            out, carried = state.policy(x), {}
        else:  # recurrent: [obs, state] -> [out, state'], zeroed at episode starts; state stored as extras
            out, carried = state.carry(state.policy, x, state.step == 0)
        infer_s += time.perf_counter() - t0
        action, extra = state.select(out, explore, rng, state.env_spec)
        extra = {**extra, **carried} if carried else extra
        if act_buf is None:
            act_buf = step_buffer(t, e, action.shape[1:], action.dtype, fill=0)
            extras = {k: step_buffer(t, e, v.shape[1:], v.dtype, fill=0) for k, v in extra.items()}
        obs_buf[i] = obs
        # Last rows carry padding (the env resets and ignores the action).
        act_buf[i] = np.where(last.reshape((e,) + (1,) * (action.ndim - 1)), 0, action)
        for k, v in extra.items():
            extras[k][i] = v
        term_buf[i] = state.obs_terminated
        trunc_buf[i] = state.obs_truncated
        ep_buf[i] = state.episode_id
        step_buf[i] = state.step
        next_obs, reward, terminated, truncated, _ = state.envs.step(action)
        rew_buf[i] = np.where(last, 0.0, reward)
        # Bookkeeping for the rows the next step will write.
        state.episode_return += np.where(last, 0.0, reward)
        ended = (terminated | truncated) & ~last
        for j in np.flatnonzero(ended):
            returns.append(float(state.episode_return[j]))
            lengths.append(int(state.step[j]) + 1)
        if last.any():  # envs that just reset start a new episode
            counter = (np.int64(task_index) << 10) | state.started_in_task
            if (state.started_in_task[last] >= _EPISODES_PER_TASK).any():
                raise RuntimeError("more than 1024 episodes started in one task; lower steps_per_task")
            state.episode_id = np.where(last, make_episode_id(state.streams, counter), state.episode_id)
            state.started_in_task += last
            state.episode_return[last] = 0.0
        state.step = np.where(last, 0, state.step + 1).astype(np.int32)
        state.obs_terminated = np.where(last, False, terminated)
        state.obs_truncated = np.where(last, False, truncated)
        state.obs = next_obs
    seconds = time.perf_counter() - start
    batch = TrajectoryBatch(
        observation=obs_buf, action=act_buf, reward=rew_buf,
        discount=(~term_buf).astype(np.float32),  # order 'K': stays env-major
        terminated=term_buf, truncated=trunc_buf, episode_id=ep_buf, step=step_buf,
        policy_version=step_buffer(t, e, (), np.int64, fill=payload.version), extras=extras,
        env_id=spec.env_id, actor_id=spec.actor_id,
        task_id=f"a{spec.actor_id:04d}-t{task_index:07d}", seed=spec.seed)
    stats = RolloutStats(spec.actor_id, task_index, t * e, payload.version, returns, lengths,
                         seconds, infer_s, _worker_name())
    return RolloutResult(batch, stats)


# Worker-local registry of actor states: (run_id, actor_id) -> ActorState.
_ACTORS: Dict[Tuple[str, int], ActorState] = {}
_ACTORS_LOCK = threading.Lock()


def run_rollout_task(spec: ActorSpec, payload, task_index: int, num_steps: int,
                     explore: Dict[str, float], after=None, capture_state: bool = False) -> RolloutResult:
    """The rollout stage as a schedulable task (any executor).

    Reuses the actor's env state if this worker holds it at the right task
    index; otherwise builds the actor (at ``spec.first_task``) or rebuilds it
    with a fresh incarnation (a retry elsewhere; module docstring). A task
    that fails drops the actor's state, so a retry starts clean. ``after``
    is the actor's previous result: passing it makes executors run an
    actor's tasks in order, and its ``next_state`` lets another worker
    continue the actor exactly.
    """
    key = (spec.run_id, spec.actor_id)
    with _ACTORS_LOCK:
        state = _ACTORS.get(key)
        if state is None or state.next_task != task_index or state.spec != spec:
            state = _state_for(spec, task_index, after)
            _ACTORS[key] = state
    try:
        with state.lock:
            result = rollout(state, payload, task_index, num_steps, explore)
            state.next_task = task_index + 1
            if capture_state:
                result.actor_state = capture_document(state)
    except BaseException:
        with _ACTORS_LOCK:
            _ACTORS.pop(key, None)
        raise
    result.next_state = LiveState(state, task_index)
    return result


def run_rollout_group(payload, tasks: Sequence[Tuple[ActorSpec, int, int, Dict[str, float], bool]],
                      after: Optional[Dict[int, Any]] = None, threads: int = 1) -> List[RolloutResult]:
    """Several actors' rollout tasks of one block as one schedulable task (fewer, longer tasks).

    A scheduler's and a driver's costs are per task (``benchmarks/studies/cluster_scale.py``): the
    actors pinned to one worker run their block as one task instead of one each. ``tasks`` holds
    ``(spec, task_index, num_steps, explore, capture_state)``, every actor's in order; each is
    exactly :func:`run_rollout_task`. ``after`` maps an actor to its previous result as that takes it,
    or to the list a previous group returned (the actor's last result in it is taken). Each actor's
    tasks run in order on one thread, ``threads`` actors at a time (the worker's threads, as Dask
    would run one-actor tasks). Returns the results in ``tasks``'s order.

    Any task that fails fails the group, and a retry runs every actor of it again: the actors whose
    tasks had finished are rebuilt from seeds at their task (fault-tolerant, not bit-identical; module
    docstring), as a lone task's retry would be.
    """
    after = after or {}
    by_actor: Dict[int, List[int]] = {}
    for i, t in enumerate(tasks):
        by_actor.setdefault(int(t[0].actor_id), []).append(i)
    out: List[Any] = [None] * len(tasks)
    worker = _worker_name()         # the pool's threads are not the worker's: get_worker() fails there

    def chain(actor: int) -> None:
        prev = _previous_result(after.get(actor), actor)
        for i in by_actor[actor]:
            spec, k, steps, explore, capture = tasks[i]
            prev = out[i] = run_rollout_task(spec, payload, k, steps, explore, after=prev, capture_state=capture)
            prev.stats.worker = worker

    if threads <= 1 or len(by_actor) == 1:
        for actor in by_actor:
            chain(actor)
    else:
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(min(threads, len(by_actor)),
                                                   thread_name_prefix="actor") as pool:
            for fut in [pool.submit(chain, a) for a in by_actor]:
                fut.result()
    return out


def _previous_result(ref: Any, actor: int) -> Any:
    """``after=`` of ``actor``'s next task from :func:`run_rollout_group`'s ``after`` entry."""
    if isinstance(ref, list):        # a previous group's results: the actor's last task among them
        mine = [r for r in ref if int(r.batch.actor_id) == actor]
        return mine[-1] if mine else None
    return ref


def capture_document(state: ActorState) -> Dict[str, Any]:
    """``core.actor_state.capture(state)``, or ``{"unsupported": reason}`` for envs it refuses."""
    from core.actor_state import ActorStateUnsupported, capture
    try:
        return capture(state)
    except ActorStateUnsupported as e:
        return {"unsupported": str(e)}


class StoredState:
    """An actor's state document read back from a committed shard: ``after=`` of its next task (resume)."""

    def __init__(self, doc: Dict[str, Any]):
        self.doc = doc

    @property
    def task(self) -> int:
        return int(self.doc["task"])

    def restore(self, spec: ActorSpec) -> ActorState:
        from core.actor_state import restore
        return restore(spec, self.doc)


def _state_for(spec: ActorSpec, task_index: int, after) -> ActorState:
    """The actor's state before ``task_index`` when this worker does not hold it (module docstring)."""
    if isinstance(after, StoredState) and after.task == task_index:
        return after.restore(spec)
    live = getattr(after, "next_state", None)
    blob = live.blob() if live is not None and after.stats.task_index == task_index - 1 else None
    if blob is not None:
        state = ActorState.restore(blob)
        if state.spec == spec:
            return state
    return ActorState(spec, task_index, incarnation=0 if task_index == spec.first_task else 1)


def release_actors(run_id: str) -> int:
    """Drop every actor state of ``run_id`` held by this process; returns how many."""
    with _ACTORS_LOCK:
        keys = [k for k in _ACTORS if k[0] == run_id]
        for k in keys:
            _ACTORS.pop(k).envs.close()
    return len(keys)


def _worker_name() -> str:
    try:
        from distributed import get_worker
        return get_worker().address
    except (ImportError, ValueError):
        return f"pid{os.getpid()}"
