"""InferenceServer: SEED-style batched inference for env-only actors, in the learner process.

Each env-only actor (:mod:`core.inference.client`) holds one gRPC
bidirectional stream. The server

* decodes and validates every message (:mod:`protocol`): a malformed or
  oversized request aborts *that* stream with ``INVALID_ARGUMENT`` (or gRPC's
  own ``RESOURCE_EXHAUSTED`` above ``max_message_bytes``); the other streams
  keep being served;
* keeps each env's state between steps: its frame stack (pixels), its
  previous action and its place in the current unroll (recurrent agents would
  keep their core state here too);
* batches network inputs from all streams with a :class:`DynamicBatcher`
  (max batch size and max wait time) and runs the policy once per batch with
  LiteRT at the payload's precision (fp32 or int8), one inference thread;
* selects actions with the agent's action selector (``categorical`` stores
  the behaviour logits for V-trace);
* assembles ``[T, E]`` unrolls per actor (:class:`UnrollAssembler`) that the
  trainer drains with :meth:`drain` and writes as replay shards through the
  commit log.

A stream that breaks (actor killed, network) just ends: its unfinished unroll
is dropped and a reconnecting actor starts fresh episodes on a new connection
number. ``step_budget`` throttles actors when the learner falls behind its
replay ratio (responses wait; the stream stays open).

Example::

    server = InferenceServer("unix:///tmp/db.sock", payload, spec, unroll_length=32).start()
    ...
    server.set_policy(new_payload)        # next batches use the new version
    batches = server.drain()
    server.request_stop(); server.stop()
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
from concurrent import futures
from typing import Any, Dict, List, Optional

import numpy as np

from core.exploration import SELECTORS
from core.inference import protocol
from core.inference.batching import DynamicBatcher
from core.inference.unrolls import UnrollAssembler
from core.trajectory import TrajectoryBatch


class FrameStacker:
    """The last ``k`` frames of each env, oldest first, stacked on the channel axis.

    Only single frames are stored in replay; the learner stacks them again at
    sampling time in the same order (:mod:`core.agents.vtrace.learning`).
    A new episode (``step == 0``) fills the stack with its first frame.
    """

    def __init__(self, k: int):
        self.k = int(k)
        self.frames: Optional[np.ndarray] = None

    def __call__(self, obs: np.ndarray, new_episode: np.ndarray) -> np.ndarray:
        if self.k == 1:
            return obs
        frame = obs if obs.ndim == 4 else obs[..., None]          # [E, H, W, C]
        if self.frames is None:
            self.frames = np.repeat(frame[:, None], self.k, axis=1)
        else:
            self.frames = np.concatenate([self.frames[:, 1:], frame[:, None]], axis=1)
            self.frames[new_episode] = frame[new_episode][:, None]
        return np.concatenate(list(np.moveaxis(self.frames, 1, 0)), axis=-1)


class InferenceServer:
    """gRPC bidi-streaming inference service (see module docstring).

    Args:
      address: ``unix:///path.sock`` (local runs) or ``host:port`` (TCP; port 0 picks a free one).
      payload: the first :class:`core.quantize.PolicyPayload` (fp32 or int8).
      spec: the env's :class:`core.envs.EnvSpec`; requests must match its observation shape.
      unroll_length: rows per emitted TrajectoryBatch.
      selector: action selector name in :mod:`core.exploration`; ``explore`` its parameters.
      max_batch_size, max_wait_s: dynamic batching bounds.
      frame_stack: frames stacked into the network input (pixels).
      max_message_bytes: larger requests are rejected by gRPC.
      max_streams: concurrent actor streams (one handler thread each).
      first_connection: connection numbers start here (pass a new base after a restart
        so episode ids never repeat within a run).
    """

    def __init__(self, address: str, payload, spec, unroll_length: int = 32, selector: str = "categorical",
                 explore: Optional[Dict[str, float]] = None, max_batch_size: int = 64, max_wait_s: float = 0.002,
                 frame_stack: int = 1, max_message_bytes: int = 16 << 20, max_streams: int = 64,
                 litert_threads: int = 1, first_connection: int = 0, seed: int = 0):
        from core.policy import LiteRTPolicy
        self.address, self.spec, self.unroll_length = address, spec, int(unroll_length)
        self.select = SELECTORS[selector]
        self.explore = dict(explore or {})
        self.frame_stack = int(frame_stack)
        self.max_message_bytes = int(max_message_bytes)
        self.max_streams = int(max_streams)
        self.seed = int(seed)
        self.policy = LiteRTPolicy(payload, batch_size=max_batch_size, num_threads=litert_threads)
        self._pending_payload = None
        self.batcher = DynamicBatcher(self._infer, max_batch_size, max_wait_s,
                                      expected_requests=lambda: self.active_streams)
        self._connections = itertools.count(int(first_connection))
        self._lock = threading.Lock()
        self._budget_cv = threading.Condition()
        self._unrolls: "collections.deque[TrajectoryBatch]" = collections.deque()
        self._episodes: "collections.deque[tuple]" = collections.deque()
        self._stop = threading.Event()       # the run is over: actors are told to stop
        self._closing = threading.Event()    # the server is going away: actors will reconnect
        self.step_budget: Optional[int] = None     # env steps the actors may take in total (None = no limit)
        self.env_steps = 0
        self.active_streams = 0
        self.rejected = 0
        self.connections_opened = 0
        self._server = None
        self._t0 = time.perf_counter()

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> "InferenceServer":
        import grpc
        opts = [("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
                ("grpc.so_reuseport", 0)]
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.max_streams + 2,
                                                              thread_name_prefix="inference-stream"),
                                   options=opts, maximum_concurrent_rpcs=self.max_streams)
        handler = grpc.stream_stream_rpc_method_handler(self._act)   # raw bytes in/out
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(protocol.SERVICE, {"Act": handler}),))
        port = self._server.add_insecure_port(self.address)
        if port == 0 and not self.address.startswith("unix:"):
            raise OSError(f"inference server could not bind {self.address!r}")
        if not self.address.startswith("unix:") and self.address.rsplit(":", 1)[-1] == "0":
            self.address = f"{self.address.rsplit(':', 1)[0]}:{port}"
        self._server.start()
        return self

    def stop(self, grace: float = 1.0) -> None:
        """Stops serving (open streams are cancelled; actors see UNAVAILABLE/CANCELLED and reconnect).

        Unlike :meth:`request_stop` this does not tell actors the run is over:
        it is what a crash or restart looks like to them.
        """
        self._closing.set()
        with self._budget_cv:
            self._budget_cv.notify_all()
        if self._server is not None:
            self._server.stop(grace).wait(grace + 5)
        self.batcher.close()

    def request_stop(self) -> None:
        """Tell every actor the run is over: the next responses carry ``stop=True``."""
        self._stop.set()
        with self._budget_cv:
            self._budget_cv.notify_all()

    # -- learner-side API -------------------------------------------------------
    def set_policy(self, payload) -> None:
        """Use ``payload`` for the next batches (swapped in by the inference thread)."""
        self._pending_payload = payload

    @property
    def policy_version(self) -> int:
        return self.policy.version

    def set_step_budget(self, total_env_steps: Optional[int]) -> None:
        with self._budget_cv:
            self.step_budget = total_env_steps
            self._budget_cv.notify_all()

    def drain(self) -> List[TrajectoryBatch]:
        """Unrolls completed since the last call, oldest first."""
        out = []
        while self._unrolls:
            out.append(self._unrolls.popleft())
        return out

    def pop_episodes(self) -> List[tuple]:
        """``(return, length)`` of episodes finished since the last call."""
        out = []
        while self._episodes:
            out.append(self._episodes.popleft())
        return out

    def stats(self) -> Dict[str, Any]:
        el = max(time.perf_counter() - self._t0, 1e-9)
        return {**self.batcher.stats(), "env_steps": self.env_steps, "requests_per_s": self.batcher.requests / el,
                "active_streams": self.active_streams, "rejected": self.rejected,
                "connections": self.connections_opened}

    # -- inference thread ---------------------------------------------------------
    def _infer(self, x: np.ndarray) -> np.ndarray:
        payload, self._pending_payload = self._pending_payload, None
        if payload is not None and payload.version != self.policy.version:
            self.policy.update(payload)
        return self.policy(x)

    # -- one stream per actor -------------------------------------------------------
    def _wait_for_budget(self, n: int) -> None:
        with self._budget_cv:
            while (self.step_budget is not None and self.env_steps + n > self.step_budget
                   and not self._stop.is_set() and not self._closing.is_set()):
                self._budget_cv.wait(timeout=0.1)
            self.env_steps += n

    def _hello(self, raw: bytes):
        header, _ = protocol.decode(raw, self.max_message_bytes)
        protocol.expect(header, "hello")
        try:
            actor_id, num_envs = int(header["actor_id"]), int(header["num_envs"])
            obs_shape = tuple(int(d) for d in header["obs_shape"])
        except (KeyError, TypeError, ValueError):
            raise protocol.ProtocolError("hello needs integer actor_id, num_envs and an obs_shape list") from None
        if not 1 <= num_envs <= 4096 or actor_id < 0:
            raise protocol.ProtocolError(f"hello: num_envs={num_envs}, actor_id={actor_id}; "
                                         f"valid: 1 <= num_envs <= 4096, actor_id >= 0")
        if obs_shape != tuple(self.spec.obs_shape):
            raise protocol.ProtocolError(f"hello: obs_shape {list(obs_shape)} does not match the server's "
                                         f"{list(self.spec.obs_shape)} ({self.spec.env_id})")
        return actor_id, num_envs

    def _check_step(self, arrays: Dict[str, np.ndarray], e: int) -> None:
        want = {"observation": (e,) + tuple(self.spec.obs_shape), "reward": (e,), "terminated": (e,),
                "truncated": (e,)}
        for name, shape in want.items():
            if name not in arrays:
                raise protocol.ProtocolError(f"step message lacks array {name!r}; needs {', '.join(want)}")
            if arrays[name].shape != shape:
                raise protocol.ProtocolError(f"step array {name!r} has shape {list(arrays[name].shape)}, "
                                             f"expected {list(shape)}")
        for name in ("terminated", "truncated"):
            if arrays[name].dtype != np.bool_:
                raise protocol.ProtocolError(f"step array {name!r} must be bool, got {arrays[name].dtype}")

    def _act(self, request_iterator, context):
        import grpc
        try:
            actor_id, e = self._hello(next(request_iterator))
        except StopIteration:
            return
        except protocol.ProtocolError as err:
            self.rejected += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        conn = next(self._connections)
        with self._lock:
            self.active_streams += 1
            self.connections_opened += 1
        unrolls = UnrollAssembler(actor_id, e, self.unroll_length, conn, self.spec.env_id, self.seed)
        stacker = FrameStacker(self.frame_stack)
        rng = np.random.default_rng([self.seed, actor_id, conn])
        try:
            yield protocol.encode({"kind": "welcome", "connection": conn})
            for raw in request_iterator:
                try:
                    header, arrays = protocol.decode(raw, self.max_message_bytes)
                    protocol.expect(header, "step")
                    self._check_step(arrays, e)
                except protocol.ProtocolError as err:
                    self.rejected += 1
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
                if self._stop.is_set():
                    yield protocol.encode({"kind": "actions", "stop": True})
                    return
                self._wait_for_budget(e)
                if self._closing.is_set():
                    context.abort(grpc.StatusCode.UNAVAILABLE, "inference server is shutting down")
                obs = arrays["observation"]
                new_episode = (np.ones(e, bool) if unrolls.pending is None else
                               unrolls.pending["terminated"] | unrolls.pending["truncated"])
                x = stacker(obs, new_episode).reshape(e, -1).astype(np.float32, copy=False)
                fut = self.batcher.submit(x)
                out = fut.result()
                version = self.policy.version
                action, extras = self.select(out, self.explore, rng, self.spec)
                batch = unrolls.add(obs, arrays["reward"], arrays["terminated"], arrays["truncated"],
                                    action, extras, version)
                if batch is not None:
                    self._unrolls.append(batch)
                rets, lens = unrolls.pop_episodes()
                self._episodes.extend(zip(rets, lens))
                yield protocol.encode({"kind": "actions", "stop": self._stop.is_set()},
                                      {"action": action.astype(np.int64)})
        finally:
            with self._lock:
                self.active_streams -= 1
