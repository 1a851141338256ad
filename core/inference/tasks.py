"""TaskSchedule: the central server's rollout tasks per actor: grants, versions in use, finished tasks.

The central server (:mod:`core.inference.server`) cuts each actor's steps into
rollout tasks of ``unroll_length`` steps. This module holds the bookkeeping of
those tasks, apart from the gRPC streams that play them:

* per actor (:class:`ActorTasks`, across its connections): the first task not
  finished yet (where a reconnecting actor resumes, replaying an unfinished
  task), the trainer's grants (``task -> (policy version, explore)``), how many
  connections it opened (its incarnations) and which one is live (the steps of
  an older one no longer count: it is told to stop);
* the policy payloads still needed, by version: the current one (unscheduled:
  the newest :meth:`TaskSchedule.set_policy`) and every granted version whose
  grants are not all done; the server builds its runners from them;
* finished tasks: scheduled, one :class:`core.rollout.RolloutResult` per
  ``(actor, task)`` until the trainer takes it (:meth:`TaskSchedule.result`);
  unscheduled, a queue of unrolls and episodes (:meth:`TaskSchedule.drain`).

Threads: the trainer (driver) thread grants and takes results, the server's
stream threads connect, wait for grants and finish tasks, and the thread that
runs a batch (the batcher's, or a stream's) looks payloads up. All state
changes under one condition, the server's own, so one ``notify_all`` wakes a
stream waiting for its grant and a trainer waiting for results alike, and the
server's stop and shutdown wake both. Taking no lock: the reads made once per
step or poll (:meth:`TaskSchedule.has_result`, :meth:`TaskSchedule.live_connection`)
and the unscheduled queues' pops (a deque's ``popleft`` is atomic).

Example::

    cv = threading.Condition()
    tasks = TaskSchedule(cv, payload, scheduled=True)
    with cv:
        earlier, first_task = tasks.connect(actor_id=0, connection=5)   # a stream opens
    tasks.grant(0, first_task, payload, {"epsilon": 0.1})                   # trainer thread
    version, explore = tasks.wait_grant(0, first_task, 5, stopped=lambda: False)   # stream thread
    tasks.finish(0, first_task, RolloutResult(batch, stats))                # stream thread
    tasks.result(0, first_task)       # -> that RolloutResult (taken: a second call gets None)
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from core.rollout import RolloutResult
from core.trajectory import TrajectoryBatch

#: A grant: the policy version and the selector parameters a task acts with.
Grant = Tuple[int, Dict[str, float]]


class ActorTasks:
    """One actor's tasks across its connections: where it resumes, its grants, its live connection.

    Args:
      first_task: the task its first connection starts at (a resumed run's first block).
    """

    __slots__ = ("next_task", "grants", "connections", "live")

    def __init__(self, first_task: int):
        self.next_task = first_task          # the first task not finished yet (a reconnect plays it again)
        self.grants: Dict[int, Grant] = {}   # task -> (version, explore)
        self.connections = 0
        self.live = -1                       # the connection whose steps count


class TaskSchedule:
    """Grants, policy versions in use and finished tasks of every actor (see module docstring).

    Args:
      cv: the condition guarding all of it, shared with the server (its stop wakes waiters here).
      payload: the first :class:`core.quantize.PolicyPayload`, the current one until :meth:`set_policy`.
      scheduled: tasks wait for :meth:`grant` and finish into :meth:`result`; False: they finish into
        :meth:`drain` and :meth:`pop_episodes`.
      first_task: the task every actor's first connection starts at.
    """

    def __init__(self, cv: threading.Condition, payload, scheduled: bool = False, first_task: int = 0):
        self.cv = cv
        self.scheduled, self.first_task = bool(scheduled), int(first_task)
        self.current = payload                        # unscheduled: the newest set_policy payload
        self._payloads: Dict[int, Any] = {payload.version: payload}    # versions granted or current
        self._uses: Dict[int, int] = collections.Counter()             # version -> grants not yet done
        self._actors: Dict[int, ActorTasks] = {}                       # actor id -> its tasks
        self._results: Dict[Tuple[int, int], RolloutResult] = {}       # (actor, task) -> finished task
        self._unrolls: "collections.deque[TrajectoryBatch]" = collections.deque()
        self._episodes: "collections.deque[tuple]" = collections.deque()

    # -- policy versions ------------------------------------------------------------
    def set_policy(self, payload) -> None:
        """Unscheduled: ``payload`` is the current policy from now on."""
        with self.cv:
            self._payloads[payload.version] = payload
            for v in [v for v in self._payloads if v < self.current.version and not self._uses[v]]:
                del self._payloads[v]      # older than the one in use until now: no step can ask for it
            self.current = payload

    def payload(self, version: int):
        """The payload of ``version`` (granted and not done, or current)."""
        with self.cv:
            return self._payloads[version]

    # -- trainer (driver) thread -------------------------------------------------------
    def grant(self, actor_id: int, task: int, payload, explore: Dict[str, float]) -> None:
        """Actor ``actor_id``'s task ``task`` acts with ``payload`` and selector params ``explore``."""
        with self.cv:
            self._payloads.setdefault(payload.version, payload)
            self._uses[payload.version] += 1
            self._actor(actor_id).grants[task] = (payload.version, dict(explore))
            self.cv.notify_all()

    def result(self, actor_id: int, task: int) -> Optional[RolloutResult]:
        """The finished task's :class:`core.rollout.RolloutResult` (taken: a second call gets None)."""
        with self.cv:
            return self._results.pop((actor_id, task), None)

    def has_result(self, actor_id: int, task: int) -> bool:
        """Whether the task finished and its result was not taken yet (a dict lookup: no lock)."""
        return (actor_id, task) in self._results

    def wait_for_results(self, timeout: float) -> None:
        """Block until a task finishes (or anything else notifies, or ``timeout`` s pass)."""
        with self.cv:
            self.cv.wait(timeout)

    def drain(self) -> List[TrajectoryBatch]:
        """Unscheduled: unrolls completed since the last call, oldest first."""
        out = []
        while self._unrolls:
            out.append(self._unrolls.popleft())
        return out

    def pop_episodes(self) -> List[tuple]:
        """Unscheduled: ``(return, length)`` of episodes finished since the last call."""
        out = []
        while self._episodes:
            out.append(self._episodes.popleft())
        return out

    # -- stream threads -------------------------------------------------------------
    def connect(self, actor_id: int, connection: int) -> Tuple[int, int]:
        """``connection`` becomes the actor's live one; an older stream of it stops at its next step.

        The caller holds :attr:`cv`: the server registers the stream's counters
        and recurrent state in the same critical section, so no reader sees the
        new live connection without them.

        Returns:
          ``(connections the actor opened before, its first task not finished yet)``.
        """
        tasks = self._actor(actor_id)
        earlier = tasks.connections
        tasks.connections += 1
        tasks.live = connection
        self.cv.notify_all()               # an older stream waiting for a grant gives up now
        return earlier, tasks.next_task

    def live_connection(self, actor_id: int) -> int:
        """The actor's live connection (after :meth:`connect`).

        Read without the lock, once per step: a stale answer only delays an
        older stream's stop by one step.
        """
        return self._actors[actor_id].live

    def wait_grant(self, actor_id: int, task: int, connection: int,
                   stopped: Callable[[], bool]) -> Optional[Grant]:
        """Scheduled: block until ``task`` is granted; its ``(version, explore)``.

        None: give up, because ``stopped()`` (the run is over or the server is
        going away) or ``connection`` is no longer the actor's live one.
        """
        with self.cv:
            tasks = self._actor(actor_id)
            while task not in tasks.grants:
                if stopped() or tasks.live != connection:
                    return None
                self.cv.wait(0.1)
            return tasks.grants[task]

    def finish(self, actor_id: int, task: int, result: RolloutResult) -> None:
        """A task's unroll is complete: keep it for :meth:`result` (scheduled) or :meth:`drain`.

        Its grant is done; the payload of a version no grant uses any more, and
        that is not the current one, is no longer kept.
        """
        with self.cv:
            tasks = self._actor(actor_id)
            tasks.next_task = max(tasks.next_task, task + 1)
            if self.scheduled:
                version, _ = tasks.grants.pop(task)
                self._uses[version] -= 1
                if not self._uses[version]:
                    del self._uses[version]
                    if version != self.current.version:
                        self._payloads.pop(version, None)
                self._results[(actor_id, task)] = result
            else:
                self._unrolls.append(result.batch)
                self._episodes.extend(zip(result.stats.episode_returns, result.stats.episode_lengths))
            self.cv.notify_all()

    def _actor(self, actor_id: int) -> ActorTasks:
        """The actor's tasks across its connections (the caller holds the lock)."""
        if actor_id not in self._actors:
            self._actors[actor_id] = ActorTasks(self.first_task)
        return self._actors[actor_id]
