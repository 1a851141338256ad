"""Env-only actors: step envs, stream observations to the inference server, apply its actions.

An actor (:func:`run_env_actor_task`, schedulable on any executor: a local
process or thread, or a Dask task) never runs a policy. Per step it sends its
``E`` envs' ``(o_t, r_{t-1}, terminated_t, truncated_t)`` and receives ``a_t``.

Faults:

* **reconnect = fresh env state** (SEED's run_id): every (re)connection
  rebuilds the envs, seeded from ``(seed, actor, task)`` for the task the
  server's ``welcome`` names (the actor's next unfinished rollout task, as a
  rebuilt local actor in :mod:`core.rollout`), and starts new episodes, so the
  server never has to splice a half-seen episode (and a recurrent policy's
  state starts from zero: the server drops the old connection's);
* **server restart**: a broken stream (UNAVAILABLE, CANCELLED, ...) is
  retried with exponential backoff (``backoff_s`` doubling up to
  ``max_backoff_s``) and the actor continues;
* **unreachable address**: after ``give_up_s`` without a working connection
  the task fails with :class:`InferenceUnavailable`, a one-line message naming
  the address and how long it tried;
* **resume**: a welcome that carries ``env_state`` (a resumed run's stored
  state, :mod:`core.inference.states`) restores the envs from it instead of
  seeds, so the actor continues its episodes exactly; and a reply with
  ``state: k`` (the end of a plan block) asks for the envs' state before task
  ``k`` with the next step, which the server stores in the block's shard;
* a server that rejects the actor's messages (``INVALID_ARGUMENT``) or its
  token (``UNAUTHENTICATED``) will reject it again: raised at once, no retry.

The actor is handed a :class:`core.inference.endpoint.ServerEndpoint`: the
address, the run token (sent as metadata on every stream) and, with TLS, the
certificate it trusts (then the channel is ``grpc.secure_channel``).

Example::

    stats = run_env_actor_task(server.endpoint(), ActorSpec("r", "CartPole-v1", 8, 0, 0))
    stats["env_steps"], stats["reconnects"]
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import time
from typing import Any, Dict, List, Optional

import numpy as np

from core.inference import protocol


class InferenceUnavailable(ConnectionError):
    """The inference server could not be reached (one-line message)."""


class _Session:
    """One bidi stream on gRPC's sync API: a request queue feeding gRPC and the response iterator.

    For callers that drive a stream by hand (tests); actors use :class:`_AsyncSession`.
    """

    def __init__(self, channel, spec, obs_shape, obs_dtype: str, metadata=()):
        self.requests: "queue.Queue[Optional[bytes]]" = queue.Queue()
        call = channel.stream_stream(protocol.METHOD)      # bytes in, bytes out
        self.responses = call(iter(self.requests.get, None), metadata=metadata)
        self.call = self.responses
        self.send({"kind": "hello", "actor_id": spec.actor_id, "num_envs": spec.num_envs, "env_id": spec.env_id,
                   "obs_shape": list(obs_shape), "obs_dtype": obs_dtype})
        header, _ = self.receive("welcome")
        self.connection, self.task, self.incarnation = (int(header[k]) for k in ("connection", "task", "incarnation"))

    def send(self, header: Dict[str, Any], arrays: Optional[Dict[str, np.ndarray]] = None) -> None:
        self.requests.put(protocol.encode(header, arrays))

    def receive(self, kind: str):
        header, arrays = protocol.decode(next(self.responses))
        protocol.expect(header, kind)
        return header, arrays

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()


def _retryable(err: Exception) -> bool:
    import grpc
    if isinstance(err, (grpc.FutureTimeoutError, asyncio.TimeoutError, _StreamEnded)):
        return True
    if isinstance(err, grpc.RpcError):
        return err.code() not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED,
                                  grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
    return isinstance(err, StopIteration)


def run_env_actor_task(endpoint, spec, max_env_steps: Optional[int] = None, give_up_s: float = 30.0,
                       backoff_s: float = 0.05, max_backoff_s: float = 2.0, connect_timeout_s: float = 2.0,
                       max_message_bytes: int = 16 << 20) -> Dict[str, Any]:
    """Run one env-only actor until the server says stop (or ``max_env_steps``); returns its stats.

    The stream runs on gRPC's asyncio API in a private event loop: a step's
    write and read happen on this thread, where the sync API hands every
    request to an iterator thread and every reply back from a polling thread
    (measured on this 2-core machine: -20% client CPU and -30% latency per
    round trip).

    Args:
      endpoint: a :class:`core.inference.endpoint.ServerEndpoint` (address ``unix:///path.sock``
        or ``host:port``, run token, TLS root certificate or None).
      spec: a :class:`core.actor.ActorSpec` (env id, num_envs, seed, actor id).
      max_env_steps: stop after this many env steps (None: until the server's stop).
      give_up_s: fail with :class:`InferenceUnavailable` after this long without a connection.
    """
    return _in_event_loop(_run_actor(endpoint, spec, max_env_steps, give_up_s, backoff_s, max_backoff_s,
                                     connect_timeout_s, max_message_bytes))


def run_env_actors_task(endpoint, specs, **kwargs) -> List[Dict[str, Any]]:
    """Several env-only actors in one task, one event loop (:func:`run_env_actor_task`'s ``kwargs``).

    While one actor waits for its reply the others step their envs, so a
    worker with one thread serves all the actors placed on it: a scheduled
    server (:mod:`core.inference.server`) needs every actor's tasks, and an
    actor task per thread would leave the others queued behind it.
    """
    async def actors():
        return await asyncio.gather(*[_run_actor(endpoint, spec, kwargs.get("max_env_steps"),
                                                 kwargs.get("give_up_s", 30.0), kwargs.get("backoff_s", 0.05),
                                                 kwargs.get("max_backoff_s", 2.0),
                                                 kwargs.get("connect_timeout_s", 2.0),
                                                 kwargs.get("max_message_bytes", 16 << 20)) for spec in specs])
    return list(_in_event_loop(actors()))


def _in_event_loop(run):
    """Run coroutine ``run`` in a private event loop (on a thread of its own inside a running loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run)
    # Called from inside a running event loop (e.g. an async task runner): run on a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run).result()


class _StreamEnded(Exception):
    """The server closed the stream without a reply (it is going away): reconnect."""


class _AsyncSession:
    """One bidi stream on gRPC's asyncio API: write a request, read its reply, on one thread."""

    def __init__(self, call):
        self.call = call
        self.connection, self.task = -1, 0
        self.env_state: Optional[np.ndarray] = None    # a resumed actor's stored envs (the welcome's)

    @classmethod
    async def open(cls, channel, spec, obs_shape, obs_dtype: str, metadata=()) -> "_AsyncSession":
        session = cls(channel.stream_stream(protocol.METHOD)(metadata=metadata))    # bytes in, bytes out
        await session.send({"kind": "hello", "actor_id": spec.actor_id, "num_envs": spec.num_envs,
                            "env_id": spec.env_id, "obs_shape": list(obs_shape), "obs_dtype": obs_dtype})
        header, arrays = await session.receive("welcome")
        session.connection, session.task = int(header["connection"]), int(header["task"])
        session.env_state = arrays.get("env_state")
        return session

    async def send(self, header: Dict[str, Any], arrays: Optional[Dict[str, np.ndarray]] = None) -> None:
        await self.call.write(protocol.encode(header, arrays))

    async def receive(self, kind: str):
        import grpc
        raw = await self.call.read()
        if raw is grpc.aio.EOF:
            raise _StreamEnded()
        header, arrays = protocol.decode(raw)
        protocol.expect(header, kind)
        return header, arrays

    def close(self) -> None:
        self.call.cancel()


async def _run_actor(endpoint, spec, max_env_steps, give_up_s, backoff_s, max_backoff_s, connect_timeout_s,
                     max_message_bytes) -> Dict[str, Any]:
    """The actor loop of :func:`run_env_actor_task` (reconnect and backoff as in the module docstring)."""
    import grpc
    from core.envs import env_spec, make_vector_env
    from core.inference.states import actor_half, restore_actor_half
    from core.actor import env_seed
    address = endpoint.address
    opts = [("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes)]
    creds = (grpc.ssl_channel_credentials(root_certificates=endpoint.root_certificates)
             if endpoint.root_certificates else None)
    espec = env_spec(spec.env_id)
    env_steps, reconnects, episodes, sessions = 0, -1, 0, 0
    down_since: Optional[float] = None
    delay = backoff_s
    start = time.perf_counter()
    # Seconds summed over steps; "cpu" is this process's CPU time (all threads: gRPC's too) in them,
    # "env_cpu" this thread's CPU time stepping the envs (wall time is inflated by other users' load).
    prof = {"encode": 0.0, "round_trip": 0.0, "env_step": 0.0, "env_cpu": 0.0, "cpu": 0.0, "steps": 0}
    while max_env_steps is None or env_steps < max_env_steps:
        channel = (grpc.aio.secure_channel(address, creds, options=opts) if creds is not None
                   else grpc.aio.insecure_channel(address, options=opts))
        session = None
        envs = None
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout=connect_timeout_s)
            session = await _AsyncSession.open(channel, spec, espec.obs_shape, espec.obs_dtype, endpoint.metadata)
            sessions += 1
            reconnects += 1
            down_since, delay = None, backoff_s
            e = spec.num_envs
            if session.env_state is not None:    # a resumed run: the envs stored at the server's task
                envs, obs, term, trunc = restore_actor_half(spec, session.env_state)
            else:
                # Envs seeded as a local actor built at this task (core.rollout): a reconnect plays the
                # server's next unfinished task again from fresh envs.
                seed = env_seed(spec, session.task)
                envs, obs = make_vector_env(spec.env_id, spec.num_envs, seed, spec.max_episode_steps)
                term = np.zeros(e, bool)
                trunc = np.zeros(e, bool)
            reward = np.zeros(e, np.float32)
            state_for: Optional[int] = None      # the task whose envs the server asked for (block ends)
            while max_env_steps is None or env_steps < max_env_steps:
                t0, c0 = time.perf_counter(), time.process_time()
                step = {"observation": obs, "reward": reward.astype(np.float32), "terminated": term,
                        "truncated": trunc}
                if state_for is not None:
                    step["env_state"] = np.frombuffer(actor_half(spec, state_for, envs), np.uint8)
                await session.send({"kind": "step"}, step)
                t1 = time.perf_counter()
                header, arrays = await session.receive("actions")
                t2 = time.perf_counter()
                if header.get("stop"):
                    return _stats(spec, env_steps, reconnects, episodes, start, stopped=True, profile=prof)
                state_for = header.get("state")
                e0 = time.thread_time()
                obs, reward, term, trunc, _ = envs.step(arrays["action"])
                prof["env_cpu"] += time.thread_time() - e0
                prof["encode"] += t1 - t0
                prof["round_trip"] += t2 - t1
                prof["env_step"] += time.perf_counter() - t2
                prof["cpu"] += time.process_time() - c0
                prof["steps"] += 1
                episodes += int((term | trunc).sum())
                env_steps += e
        except Exception as err:  # noqa: BLE001  (classified below)
            if not _retryable(err):
                if isinstance(err, grpc.RpcError):
                    raise RuntimeError(f"inference server at {address} rejected actor {spec.actor_id}: "
                                       f"{err.code().name}: {err.details()}") from None
                raise
            down_since = down_since or time.perf_counter()
            waited = time.perf_counter() - down_since
            if waited >= give_up_s:
                why = err.details() if isinstance(err, grpc.RpcError) else type(err).__name__
                raise InferenceUnavailable(
                    f"inference server at {address} unreachable for {waited:.1f} s (actor {spec.actor_id}, "
                    f"{sessions} sessions so far): {why}") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_backoff_s)
        finally:
            if session is not None:
                session.close()
            if envs is not None:
                envs.close()
            await channel.close()
    return _stats(spec, env_steps, max(reconnects, 0), episodes, start, stopped=False, profile=prof)


def _stats(spec, env_steps: int, reconnects: int, episodes: int, start: float, stopped: bool,
           profile: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
    """The actor's counters; ``step_ms``: ms per step encoding, waiting for the reply (round trip), stepping,
    the envs' CPU time (``env_cpu``) and the process's CPU time per step (``cpu``)."""
    seconds = time.perf_counter() - start
    n = max((profile or {}).get("steps", 0), 1)
    step_ms = {k: 1e3 * v / n for k, v in (profile or {}).items() if k != "steps"}
    return {"actor_id": spec.actor_id, "env_steps": env_steps, "reconnects": reconnects, "episodes": episodes,
            "seconds": seconds, "env_steps_per_s": env_steps / max(seconds, 1e-9), "stopped_by_server": stopped,
            "step_ms": step_ms}
