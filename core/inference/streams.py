"""The stream side of the inference server: one gRPC handler per actor connection.

:class:`ActorStreams` is the part of :class:`core.inference.server.InferenceServer`
that serves one actor's bidirectional stream (the server inherits it; it reads
the server's checks, schedule, batcher and lock, set up in the server's
``__init__``): authenticate the stream, read the actor's hello, open a
connection (a fresh recurrent carry and frame stack, or a stored resume point),
then per step: validate, hand over a finished task's unroll (with the actor's
state document when the plan stores one), wait for the next task's grant,
run the batched inference and select the actions. :class:`_Stream` is one
connection's state.

Example (what the server does for each actor; the handler is registered by ``start``)::

    for reply in server._act(request_iterator, context):   # welcome, then one reply per step
        ...
"""
from __future__ import annotations

import time
from typing import Any, Dict, Optional, Tuple

import numpy as np

from core.exploration import make_carry
from core.inference import endpoint as endpoint_lib
from core.inference import protocol
from core.inference.frames import FrameStacker
from core.inference.unrolls import UnrollAssembler
from core.rollout import RolloutResult, RolloutStats
from core.trajectory import TrajectoryBatch


class ActorStreams:
    """Serving actor streams, a part of :class:`core.inference.server.InferenceServer` (module docstring)."""

    def _begin_task(self, stream: "_Stream", task: int) -> bool:
        """Wait for ``task``'s grant (scheduled); set the stream's version, explore and RNG. False: stop."""
        if self.scheduled:
            granted = self.tasks.wait_grant(stream.actor_id, task, stream.connection, self._stopping)
            if granted is None:
                return False
            stream.version, stream.explore = granted
        stream.task, stream.task_t0, stream.infer_s = task, time.perf_counter(), 0.0
        stream.rng = np.random.default_rng([self.seed, stream.actor_id, task, 1])   # the local actor's stream
        return True

    def _finish_task(self, stream: "_Stream", task: int, batch: TrajectoryBatch, returns, lengths,
                     actor_state: Optional[Dict[str, Any]] = None) -> None:
        """A task's unroll is complete: keep it for the trainer (scheduled) or for :meth:`drain`."""
        stats = RolloutStats(stream.actor_id, task, batch.size, int(batch.policy_version.flat[0]), list(returns),
                             list(lengths), time.perf_counter() - stream.task_t0, stream.infer_s,
                             f"central a{stream.actor_id} c{stream.connection}")
        self.tasks.finish(stream.actor_id, task, RolloutResult(batch, stats, actor_state=actor_state))
        if self.on_result is not None:
            self.on_result(stream.actor_id, task)

    def _reject(self, context, code, message: str) -> None:
        with self._lock:
            self.rejected += 1
        context.abort(code, message)

    def _act(self, request_iterator, context):
        import grpc
        if not endpoint_lib.token_matches(context.invocation_metadata(), self.token):
            # Before reading a byte: an unauthenticated peer learns nothing and costs one abort.
            with self._lock:
                self.unauthenticated += 1
            self._reject(context, grpc.StatusCode.UNAUTHENTICATED,
                         "missing or wrong run token; actors get it with their spec from the trainer")
        try:
            actor_id, e = self.checks.hello(next(request_iterator))
        except StopIteration:
            return
        except protocol.ProtocolError as err:
            self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))
        stream = self._open_stream(actor_id, e)
        want = self.checks.step_shapes(e)
        try:
            resumed = {"env_state": np.frombuffer(stream.point.actor_bytes, np.uint8)} if stream.point else None
            yield protocol.encode({"kind": "welcome", "connection": stream.connection,
                                   "task": stream.unrolls.first_task, "incarnation": stream.incarnation}, resumed)
            for raw in request_iterator:
                t0 = time.perf_counter()
                try:
                    arrays = self.checks.step(raw, want)
                except protocol.ProtocolError as err:
                    self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))
                if self._stop.is_set() or self.tasks.live_connection(actor_id) != stream.connection:
                    yield protocol.encode({"kind": "actions", "stop": True})   # the run is over, or a newer
                    return                                                    # connection replaced this one
                t1 = time.perf_counter()
                # Row t-1 is complete; if it ends a task, that task is handed over before step t
                # waits for its own task's version (which may need the learner to train on it).
                done = stream.unrolls.observe(arrays["reward"], arrays["terminated"], arrays["truncated"])
                if done is not None:
                    try:
                        state = self._captured(stream, done[0], arrays)
                    except protocol.ProtocolError as err:
                        self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))
                    self._finish_task(stream, *done, actor_state=state)
                if stream.unrolls.task != stream.task and not self._begin_task(stream, stream.unrolls.task):
                    if self._closing.is_set():
                        context.abort(grpc.StatusCode.UNAVAILABLE, "inference server is shutting down")
                    yield protocol.encode({"kind": "actions", "stop": True})
                    return
                self.env_steps += e
                t2 = time.perf_counter()
                action, times = self._step(stream, arrays)
                t3 = time.perf_counter()
                header = {"kind": "actions", "stop": self._stop.is_set()}
                if self._captures(stream.unrolls.task) and stream.unrolls.ends_task:
                    header["state"] = stream.unrolls.task + 1     # send your envs with the next step
                reply = protocol.encode(header, {"action": action.astype(np.int64)})
                self._record(t1 - t0, t2 - t1, *times, time.perf_counter() - t3)
                yield reply
        finally:
            self._close_stream(stream)

    def _open_stream(self, actor_id: int, num_envs: int) -> "_Stream":
        """A new connection: fresh episodes from the actor's next unfinished task, a fresh recurrent state."""
        conn = next(self._connections)
        carry = make_carry(self.selector, self._first_payload, num_envs, self.spec.obs_dim * self.frame_stack)
        with self._cv:
            earlier, first_task = self.tasks.connect(actor_id, conn)   # an older stream of it stops
            incarnation = self.first_connection + earlier
            self.active_streams += 1
            self.connections_opened += 1
            if carry is not None:
                self._carries[actor_id] = (conn, carry)     # replaces a previous connection's state
        unrolls = UnrollAssembler(actor_id, num_envs, self.unroll_length, first_task, incarnation,
                                  self.spec.env_id, self.seed)
        stacker = FrameStacker(self.frame_stack)
        point = self.resume_points.get(actor_id)
        if point is not None and point.task == first_task:    # a resumed run: continue the stored state
            bookkeeping, stacker.frames, stored_carry = point.server_half()
            unrolls.resume(bookkeeping)
            if carry is not None:
                carry = stored_carry
                with self._cv:
                    if self._carries.get(actor_id, (None,))[0] == conn:
                        self._carries[actor_id] = (conn, carry)
        else:
            point = None
        stream = _Stream(actor_id, conn, incarnation, unrolls, stacker, carry)
        stream.point = point
        return stream

    def _captures(self, task: int) -> bool:
        """Whether ``task`` ends a plan block, so its result carries the actor's state."""
        return self.capture_every > 0 and (task + 1) % self.capture_every == 0

    def _captured(self, stream: "_Stream", task: int, arrays: Dict[str, np.ndarray]) -> Optional[Dict[str, Any]]:
        """The actor's state after ``task`` (just finished) if the plan stores it: the local actor's document.

        Raises:
          protocol.ProtocolError: the step lacks the ``env_state`` the server asked for, or it does not fit.
        """
        if not self._captures(task):
            return None
        if "env_state" not in arrays:
            raise protocol.ProtocolError(f"step opening task {task + 1} lacks the env_state the server asked for")
        from core.inference.states import join
        return join(self.spec.env_id, task + 1, stream.unrolls, stream.stacker, stream.carry,
                    arrays["observation"], arrays["terminated"], arrays["truncated"], arrays["env_state"])

    def _close_stream(self, stream: "_Stream") -> None:
        with self._lock:
            self.active_streams -= 1
            if self._carries.get(stream.actor_id, (None,))[0] == stream.connection:
                del self._carries[stream.actor_id]

    def _step(self, stream: "_Stream", arrays: Dict[str, np.ndarray]) -> Tuple[np.ndarray, Tuple[float, ...]]:
        """One step of a stream's envs: batched inference, action selection, the unroll row.

        Returns the actions and the seconds spent preparing the input, in the
        batcher (queueing + policy) and selecting/assembling.
        """
        t0 = time.perf_counter()
        obs, unrolls, e = arrays["observation"], stream.unrolls, stream.unrolls.num_envs
        new_episode = unrolls.new_episode()
        x = stream.stacker(obs, new_episode).reshape(e, -1).astype(np.float32, copy=False)
        carried: Dict[str, np.ndarray] = {}
        if stream.carry is not None:     # [obs, h, c] rows, zeroed at episode starts
            x, carried = stream.carry.inputs(x, new_episode)
        if self.scheduled:
            version, explore = stream.version, stream.explore
        else:
            version, explore = self.tasks.current.version, self.explore_params(stream.actor_id)
        t1 = time.perf_counter()
        out = self.batcher.submit(x, key=version).result()
        t2 = time.perf_counter()
        stream.infer_s += t2 - t1
        if stream.carry is not None:
            out = stream.carry.absorb(out)
        action, extras = self.select(out, explore, stream.rng, self.spec)
        unrolls.act(obs, arrays["terminated"], arrays["truncated"], action, {**extras, **carried}, version)
        return action, (t1 - t0, t2 - t1, time.perf_counter() - t2)


class _Stream:
    """Per-connection state of one actor stream (see :meth:`InferenceServer._open_stream`)."""

    __slots__ = ("actor_id", "connection", "incarnation", "unrolls", "stacker", "carry", "task", "version",
                 "explore", "rng", "task_t0", "infer_s", "point")

    def __init__(self, actor_id: int, connection: int, incarnation: int, unrolls: UnrollAssembler,
                 stacker: FrameStacker, carry):
        self.actor_id, self.connection, self.incarnation, self.unrolls = actor_id, connection, incarnation, unrolls
        self.stacker, self.carry = stacker, carry
        self.task = -1                       # the task being played (none yet)
        self.version, self.explore, self.rng = -1, {}, None
        self.task_t0 = self.infer_s = 0.0
        self.point = None                    # the ResumePoint it continues (a resumed run's first task)
