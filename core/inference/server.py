"""InferenceServer: SEED-style batched inference for env-only actors, in the learner process.

Each env-only actor (:mod:`core.inference.client`) holds one gRPC
bidirectional stream. The server

* authenticates every stream before reading it: the run token in its
  metadata, compared in constant time (:mod:`endpoint`); a missing or wrong
  token aborts the stream with ``UNAUTHENTICATED``. With ``tls`` (PEM
  certificate chain and key) it listens with ``grpc.ssl_server_credentials``;
* decodes and validates every message (:mod:`protocol`, :mod:`messages`): a malformed or
  oversized request, or observations whose dtype or shape differ from the env
  spec's, abort *that* stream with ``INVALID_ARGUMENT`` (or gRPC's own
  ``RESOURCE_EXHAUSTED`` above ``max_message_bytes``), so nothing the shard
  writer would refuse ever reaches an unroll; the other streams keep being
  served;
* keeps each env's state between steps: its frame stack (pixels,
  :class:`~core.inference.frames.FrameStacker`), its previous
  action, its place in the current unroll and, for a recurrent policy
  (R2D2's ``[obs, h, c] -> [q, h', c']``), its core state ``(h, c)``
  (:func:`core.exploration.make_carry`, the same carry local actors use). The
  state is zeroed at every episode start, and it belongs to one *connection*:
  an actor that reconnects gets a fresh carry (its envs start new episodes)
  and the stale one is dropped (:meth:`recurrent_state`);
* batches network inputs from all streams with a :class:`DynamicBatcher`
  (max batch size and max wait time; with ``adaptive_wait`` the wait is tuned
  to the measured arrival rate, bounded by ``max_wait_s``) and runs each
  batch, one at a time, through an :class:`core.inference.runners.InferenceRunner`
  (today :class:`~core.inference.runners.LiteRTRunner`: LiteRT at the
  payload's precision, fp32 or int8, in calls of the measured best size) on
  the batcher's thread, or on the stream thread that finds the policy idle
  when no wait pays, while the other stream threads decode, validate and
  assemble around it; a recurrent step is batched the same way, its rows
  being ``[obs, h, c]``;
* selects actions with the agent's action selector, with each actor's own
  parameters (``explore``: a dict, or ``actor_id -> dict`` such as R2D2's
  epsilon ladder); ``categorical`` stores the behaviour logits for V-trace,
  a recurrent policy the state each step started from (``lstm_h``/``lstm_c``);
* assembles one ``[T, E]`` unroll per rollout task of each actor
  (:class:`UnrollAssembler`, rows and ids exactly as a local actor writes
  them) that the trainer takes with :meth:`result` (or, unscheduled,
  :meth:`drain`) and writes as replay shards through the commit log. The
  bookkeeping of tasks (each actor's grants and resume point, the policy
  versions still in use, finished tasks) is :attr:`tasks`, a
  :class:`core.inference.tasks.TaskSchedule` guarded by the server's lock.

**Scheduled** (``scheduled=True``, what training uses: :mod:`pipelines.run.central`):
an actor's steps are cut into the plan's tasks (``unroll_length`` steps
each, from ``first_task``) and the step that opens task ``k`` waits until the
trainer called ``grant(actor, k, payload, explore)``: the policy version and
selector parameters the plan gives that task. So which version answers which
step, and with which exploration, is fixed by the plan, not by timing; the
actions of task ``k`` are sampled with ``default_rng([seed, actor, k, 1])``
(the local actor's stream), and batching across actors changes no row
(LiteRT rows are independent of the batch they run in, checked by
``tests/pipelines/test_central_plan.py``), so a run's replay does not depend on how
requests happened to be batched. Rows of different versions in one batch run
as separate calls (:class:`DynamicBatcher` keys), each on the runner of its
version (up to ``max_versions`` runners, least recently used recycled).
Unscheduled (tests, benchmarks), every task runs at once with the newest
:meth:`set_policy` payload and ``explore``.

``stats()["step_ms"]`` says where a request's time goes on the server (ms
per request, :data:`PHASES`); the actor's own ``step_ms`` adds its side, and
the difference of the two round trips is gRPC and the transport
(``python -m benchmarks.micro.seed_inference --profile``).

**Actor states** (``capture_every``, ``resume_points``; :mod:`core.inference.states`): the
reply to the last step of a plan block's last task asks the actor for its
envs (``state: k``); the step that opens task ``k`` brings them, and the
finished task's result carries the local actor's state document
(``RolloutResult.actor_state``), which the shard write stores. A resumed
run's connection whose next unfinished task is a stored point's continues
it: the server restores the bookkeeping, frames and carry, and the welcome
carries the envs (``env_state``) for the actor to restore.

A stream that breaks (actor killed, network) just ends: its unfinished task
is dropped and the reconnecting actor plays it again with fresh envs (seeded
from ``(seed, actor, task)``, as a rebuilt local actor) and a new
*incarnation* in its episode ids (``first_connection`` + its earlier
connections), told in the ``welcome``. An older stream of an actor that
connected again is told to stop.

The stream side (one handler per actor connection: hello, steps, tasks,
state capture) is :class:`core.inference.streams.ActorStreams`, which the
server inherits; this module holds the server's construction, lifecycle,
learner-side API, runners per policy version and statistics.

Example::

    server = InferenceServer("unix:///tmp/private-dir/db.sock", payload, spec, unroll_length=32).start()
    run_env_actor_task(server.endpoint(), actor_spec)      # address + the run token
    ...
    server.set_policy(new_payload)        # unscheduled: next steps use the new version
    batches = server.drain()
    # scheduled: server.grant(actor, task, payload, explore) ... server.result(actor, task) -> RolloutResult
    server.request_stop(); server.stop()
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
from concurrent import futures
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from core.exploration import SELECTORS
from core.inference import endpoint as endpoint_lib
from core.inference import protocol
from core.inference.batching import DynamicBatcher
from core.inference.messages import MessageChecks
from core.inference.runners import InferenceRunner, LiteRTRunner
from core.inference.streams import ActorStreams
from core.inference.tasks import TaskSchedule
from core.rollout import RolloutResult
from core.trajectory import TrajectoryBatch


#: Phases of one request on the server, in order (``stats()["step_ms"]``, ms per request).
PHASES = ("decode", "task_wait", "prepare", "batched_inference", "select_and_assemble", "encode")
class InferenceServer(ActorStreams):
    """gRPC bidi-streaming inference service (see module docstring).

    Args:
      address: ``unix:///path.sock`` (local runs) or ``host:port`` (TCP; port 0 picks a free one).
      payload: the first :class:`core.quantize.PolicyPayload` (fp32 or int8).
      spec: the env's :class:`core.envs.EnvSpec`; requests must match its observation shape.
      unroll_length: rows per emitted TrajectoryBatch.
      selector: action selector name in :mod:`core.exploration`; ``explore`` its parameters
        (one dict for every actor, or a callable ``actor_id -> dict``).
      max_batch_size, max_wait_s: dynamic batching bounds.
      frame_stack: frames stacked into the network input (pixels).
      max_message_bytes: larger requests are rejected by gRPC.
      max_streams: concurrent actor streams (one handler thread each).
      first_connection: connection numbers, and every actor's first incarnation, start here (pass a
        new base after a restart so episode ids never repeat within a run).
      scheduled: steps wait for :meth:`grant` of their task (module docstring); ``first_task``: the task
        every actor's first connection starts at (a resumed run's first block).
      max_versions: runners kept, one per policy version in use (scheduled).
      capture_every: tasks per plan block: the result of every block's last task carries the actor's state
        (``actor_state``, :mod:`core.inference.states`); 0: never.
      resume_points: actor id -> :class:`core.inference.states.ResumePoint`: a connection whose next
        unfinished task is the point's continues from it (a resumed run) instead of from seeds.
      token: the run's secret every stream must present (default: a fresh one, see :attr:`token`).
      tls: ``(certificate chain PEM, private key PEM)`` to serve over TLS; None = plaintext.
      runner: what runs the policy (default: a :class:`LiteRTRunner` of ``payload`` sized to
        ``max_batch_size``); any :class:`InferenceRunner`, e.g. one on an accelerator.
      adaptive_wait: tune each batch's wait to the measured arrival rate (bounded by ``max_wait_s``,
        :func:`core.inference.batching.adaptive_wait`); False (default): every batch waits up to
        ``max_wait_s`` for more requests (what a caller that asks for cross-actor batches wants).
    """

    def __init__(self, address: str, payload, spec, unroll_length: int = 32, selector: str = "categorical",
                 explore: Union[None, Dict[str, float], Callable[[int], Dict[str, float]]] = None,
                 max_batch_size: int = 64, max_wait_s: float = 0.002,
                 frame_stack: int = 1, max_message_bytes: int = 16 << 20, max_streams: int = 64,
                 litert_threads: int = 1, first_connection: int = 0, seed: int = 0,
                 token: Optional[str] = None, tls: Optional[tuple] = None,
                 runner: Optional[InferenceRunner] = None, adaptive_wait: bool = False,
                 scheduled: bool = False, first_task: int = 0, max_versions: int = 4,
                 capture_every: int = 0, resume_points: Optional[Dict[int, Any]] = None):
        self.address, self.spec, self.unroll_length = address, spec, int(unroll_length)
        self.selector = selector
        self.select = SELECTORS[selector]
        self.explore = explore if callable(explore) else dict(explore or {})
        self.frame_stack = int(frame_stack)
        self.max_message_bytes = int(max_message_bytes)
        self.checks = MessageChecks(spec, self.max_message_bytes)    # what each hello and step must hold
        self.max_streams = int(max_streams)
        self.seed = int(seed)
        self.token = token or endpoint_lib.new_token()    # authentication is never off
        self.tls = tls
        self.port: Optional[int] = None
        self.runner: InferenceRunner = runner or LiteRTRunner(payload, max_batch_size, litert_threads)
        self._custom_runner = runner is not None       # recycled across versions, never duplicated
        self._runners: "collections.OrderedDict[int, InferenceRunner]" = collections.OrderedDict(
            [(payload.version, self.runner)])            # version -> runner, least recently used first
        self.max_batch_size, self.litert_threads = int(max_batch_size), int(litert_threads)
        self.max_versions = max(1, int(max_versions))
        self.scheduled, self.first_task = bool(scheduled), int(first_task)
        self.capture_every, self.resume_points = int(capture_every), dict(resume_points or {})
        self._first_payload = payload                 # sizes each connection's recurrent carry
        self._carries: Dict[int, Tuple[int, Any]] = {}    # actor id -> (connection, carry) of its live stream
        self.first_connection = int(first_connection)
        self.on_result: Optional[Callable[[int, int], None]] = None   # called (actor, task) as a task finishes
        self.batcher = DynamicBatcher(self._infer, max_batch_size, max_wait_s,
                                      expected_requests=lambda: self.active_streams, adaptive=adaptive_wait)
        self._connections = itertools.count(int(first_connection))
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)     # grants, results, stop
        # Grants, versions in use and finished tasks, guarded by the same condition: a stop wakes its waiters.
        self.tasks = TaskSchedule(self._cv, payload, self.scheduled, self.first_task)
        self._stop = threading.Event()       # the run is over: actors are told to stop
        self._closing = threading.Event()    # the server is going away: actors will reconnect
        self.env_steps = 0
        self.active_streams = 0
        self.rejected = 0                    # streams aborted: bad token or bad messages
        self.unauthenticated = 0             # of which: bad or missing token
        self.connections_opened = 0
        self._server = None
        self._t0 = time.perf_counter()
        # Seconds per phase of a step, summed over requests (stats()["step_ms"]): where a central step goes.
        self._phase_s: Dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._phase_n = 0

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
        try:
            if self.tls is not None:
                cert_chain, key = self.tls
                creds = grpc.ssl_server_credentials([(key, cert_chain)])
                port = self._server.add_secure_port(self.address, creds)
            else:
                port = self._server.add_insecure_port(self.address)
        except RuntimeError:    # grpc >= 1.5x raises instead of returning 0
            port = 0
        self.port = port
        if port == 0 and not self.address.startswith("unix:"):
            raise OSError(f"inference server could not bind {self.address!r} (not an address of this host, "
                          f"or in use)")
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
        with self._cv:
            self._cv.notify_all()
        if self._server is not None:
            self._server.stop(grace).wait(grace + 5)
        self.batcher.close()

    def request_stop(self) -> None:
        """Tell every actor the run is over: the next responses carry ``stop=True``."""
        self._stop.set()
        with self._cv:
            self._cv.notify_all()

    def _stopping(self) -> bool:
        """The run is over or the server is going away: a stream waiting for its grant gives up."""
        return self._stop.is_set() or self._closing.is_set()

    # -- learner-side API -------------------------------------------------------
    def endpoint(self, address: Optional[str] = None) -> endpoint_lib.ServerEndpoint:
        """What actors are handed: ``address`` (default: the bound one), the token, the TLS root."""
        root = self.tls[0] if self.tls is not None else None
        return endpoint_lib.ServerEndpoint(address or self.address, self.token, root)

    def set_policy(self, payload) -> None:
        """Unscheduled: use ``payload`` from the next steps on (its runner is made by the inference thread)."""
        self.tasks.set_policy(payload)

    @property
    def policy_version(self) -> int:
        return self.tasks.current.version

    def grant(self, actor_id: int, task: int, payload, explore: Dict[str, float]) -> None:
        """Scheduled: actor ``actor_id``'s task ``task`` acts with ``payload`` and selector params ``explore``."""
        self.tasks.grant(actor_id, task, payload, explore)

    def result(self, actor_id: int, task: int) -> Optional[RolloutResult]:
        """Scheduled: the finished task's :class:`core.rollout.RolloutResult` (taken: a second call gets None)."""
        return self.tasks.result(actor_id, task)

    def has_result(self, actor_id: int, task: int) -> bool:
        return self.tasks.has_result(actor_id, task)

    def wait_for_results(self, timeout: float) -> None:
        """Block until a task finishes (or ``timeout`` s pass)."""
        self.tasks.wait_for_results(timeout)

    def explore_params(self, actor_id: int) -> Dict[str, float]:
        """The selector parameters of ``actor_id`` now."""
        return self.explore(actor_id) if callable(self.explore) else self.explore

    def recurrent_state(self, actor_id: int) -> Optional[Tuple[int, np.ndarray, np.ndarray]]:
        """``(connection, h, c)`` the server holds for ``actor_id``'s live stream (None: none held)."""
        with self._lock:
            held = self._carries.get(actor_id)
        if held is None:
            return None
        conn, carry = held
        return conn, carry.h.copy(), carry.c.copy()

    def drain(self) -> List[TrajectoryBatch]:
        """Unrolls completed since the last call, oldest first."""
        return self.tasks.drain()

    def pop_episodes(self) -> List[tuple]:
        """``(return, length)`` of episodes finished since the last call."""
        return self.tasks.pop_episodes()

    def stats(self) -> Dict[str, Any]:
        el = max(time.perf_counter() - self._t0, 1e-9)
        step_ms = {k: 1e3 * v / max(self._phase_n, 1) for k, v in self._phase_s.items()}
        return {**self.batcher.stats(), "step_ms": step_ms, "env_steps": self.env_steps,
                "chunk_rows": getattr(self.runner, "chunk_rows", None),
                "calibration_ms": dict(getattr(self.runner, "calibration", {})),
                "requests_per_s": self.batcher.requests / el,
                "active_streams": self.active_streams, "rejected": self.rejected,
                "unauthenticated": self.unauthenticated, "tls": self.tls is not None,
                "connections": self.connections_opened, "address": self.address}

    # -- inference thread ---------------------------------------------------------
    def _infer(self, x: np.ndarray, version: int) -> np.ndarray:
        return self._runner_for(version)(x)

    def _runner_for(self, version: int) -> InferenceRunner:
        """The runner of ``version`` (the batcher's run lock is held: one call at a time)."""
        runner = self._runners.get(version)
        if runner is not None:
            self._runners.move_to_end(version)
            return runner
        payload = self.tasks.payload(version)
        if self._custom_runner or len(self._runners) >= self.max_versions:
            _, runner = self._runners.popitem(last=False)     # least recently used: a version done with
            runner.update(payload)
        else:    # the first runner measured the best call size already
            runner = LiteRTRunner(payload, self.max_batch_size, self.litert_threads,
                                  chunk_rows=getattr(self.runner, "chunk_rows", None))
        self._runners[version] = runner
        return runner

    def _record(self, *seconds: float) -> None:
        with self._lock:
            for k, v in zip(PHASES, seconds):
                self._phase_s[k] += v
            self._phase_n += 1
