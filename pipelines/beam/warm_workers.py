"""Warm worker processes for a training run's round pipelines on the DirectRunner.

On the DirectRunner every round pipeline starts new SDK worker processes (one
per ``--direct_num_workers``): each imports Beam (~1.5 s on a 2-core Zen 4) and,
for the round's learner, TensorFlow (~3 s) before its first block, then exits.
:class:`WarmWorkers` keeps that many worker processes for the whole run instead:
a round's worker is an SDK harness (Beam's ``SdkHarness``, as Beam's own
external worker pool runs it) started in one of them, so the imports are paid
once per run.

Each round still starts from durable data, as on Dataflow, where a round's
workers are new machines: before a harness starts, the process drops the
previous round's learner (:func:`pipelines.beam.learner.forget_learners`), so
the round's first learner block builds the learner and restores its state
from ``beam/learner``, exactly as a new process does. What stays are imported
modules and TensorFlow's thread pools (the run's, set by the first round).

To Beam it is an ``EXTERNAL`` environment: :func:`warm_options` adds
``--environment_type EXTERNAL --environment_config 127.0.0.1:PORT`` and
:func:`pipelines.executors.beam.runner_for` runs rounds there. PORT is this
launcher's worker-pool service (Beam's ``BeamFnExternalWorkerPool``), bound
to the loopback interface only; it hands each ``StartWorker`` to an idle
process over the process's stdin and stdout (the processes listen on nothing).
A process that died (killed, out of memory) is replaced at the next
``StartWorker``; one that is serving a harness is never given a second. One
that dies while it serves a round would leave Beam's runner waiting for that
round forever: :func:`warm_options` then raises :class:`WorkerLost` in the
launcher's main thread (SIGUSR1 to itself), so the run ends with one line and
``--resume`` continues after the last finished round.
The processes ignore SIGINT (a terminal's Ctrl-C is the launcher's planned
stop: the round in flight finishes) and end when the launcher closes them, or
when their stdin closes because the launcher is gone.

Example::

    with warm_options(options) as options:     # options unchanged unless DirectRunner multi_processing
        RoundLauncher(cfg, run_dir, options, ...).run()
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import traceback
from typing import Any, Callable, Dict, Iterator, List, Optional

#: Seconds a process may take to report a harness started (Beam's import on its first request included).
START_TIMEOUT_S = 120.0
#: Seconds a StartWorker waits for a busy process's harness to report its end before starting one more.
IDLE_WAIT_S = 5.0


class WorkerLost(RuntimeError):
    """A warm worker process died while it served a round's harness: the round in flight is lost (Beam's
    runner would wait for it forever), the blocks it finished keep their records, ``--resume`` goes on."""


class _Process:
    """One warm worker process; ``busy`` until its harness reports the end (guarded by the pool's ``changed``)."""

    def __init__(self, changed: threading.Condition, on_lost: Optional[Callable[[str], None]]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "pipelines.beam.warm_workers"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.busy = False
        self.closing = False
        self.replies: List[Dict[str, Any]] = []
        self.changed, self.on_lost = changed, on_lost
        threading.Thread(target=self._read, name=f"warm-worker-{self.proc.pid}", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            with self.changed:
                if "idle" in message:
                    self.busy = False
                else:
                    self.replies.append(message)
                self.changed.notify_all()
        with self.changed:                     # the process ended
            lost = self.busy and not self.closing
            self.changed.notify_all()
        if lost and self.on_lost is not None:
            self.on_lost(f"a Beam worker process (pid {self.proc.pid}) died during a round "
                         f"(exit status {self.proc.wait()}): that round is lost")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, request_bytes: bytes) -> str:
        """Ask the process (marked busy by the caller) to start a harness; its error text, or ""."""
        with self.changed:
            self.replies.clear()
        try:
            self.proc.stdin.write(json.dumps({"start": base64.b64encode(request_bytes).decode()}) + "\n")
            self.proc.stdin.flush()
        except OSError as e:
            return f"warm Beam worker pid {self.proc.pid} is gone: {e}"
        with self.changed:
            if not self.changed.wait_for(lambda: self.replies or not self.alive(), timeout=START_TIMEOUT_S):
                return f"warm Beam worker pid {self.proc.pid} did not start a harness in {START_TIMEOUT_S:.0f} s"
            if not self.replies:
                return f"warm Beam worker pid {self.proc.pid} exited with status {self.proc.wait()}"
            return self.replies[0].get("error", "")

    def close(self, timeout_s: float = 10.0) -> None:
        self.closing = True
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class WarmWorkers:
    """``count`` warm worker processes behind one ``BeamFnExternalWorkerPool`` service on 127.0.0.1."""

    def __init__(self, count: int, on_lost: Optional[Callable[[str], None]] = None) -> None:
        """``on_lost(message)`` is called (from a reader thread) when a process dies while serving a harness."""
        import grpc
        from apache_beam.portability.api import beam_fn_api_pb2_grpc
        from concurrent import futures
        self.changed, self.on_lost = threading.Condition(), on_lost
        self.processes = [self._new() for _ in range(max(1, count))]   # they import while the launcher sets up
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="warm-pool"))
        port = self._server.add_insecure_port("127.0.0.1:0")
        beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(self, self._server)
        self._server.start()
        self.address = f"127.0.0.1:{port}"

    def _new(self) -> _Process:
        return _Process(self.changed, self.on_lost)

    def _take_idle(self) -> _Process:
        """An idle live process, marked busy: waits up to IDLE_WAIT_S for a harness that is ending to report
        it, then starts one more process. Dead processes are dropped."""
        with self.changed:
            def idle() -> Optional[_Process]:
                for p in [p for p in self.processes if not p.alive()]:
                    self.processes.remove(p)
                    p.close(0)
                return next((p for p in self.processes if not p.busy), None)
            self.changed.wait_for(idle, timeout=IDLE_WAIT_S if self.processes else 0)
            p = idle()
            if p is None:
                p = self._new()
                self.processes.append(p)
            p.busy = True
            return p

    def StartWorker(self, request, context):  # noqa: N802 - the gRPC service's method name
        from apache_beam.portability.api import beam_fn_api_pb2
        process = self._take_idle()
        error = process.start(request.SerializeToString())
        if error:                                   # no harness runs there: the process is free again
            with self.changed:
                process.busy = False
                self.changed.notify_all()
        return beam_fn_api_pb2.StartWorkerResponse(error=error)

    def StopWorker(self, request, context):  # noqa: N802 - a harness ends when its pipeline closes it
        from apache_beam.portability.api import beam_fn_api_pb2
        return beam_fn_api_pb2.StopWorkerResponse()

    def options(self, options):
        """A copy of ``options`` with this pool as their ``EXTERNAL`` environment."""
        from pipelines.executors.beam import with_flags
        return with_flags(options, environment_type="EXTERNAL", environment_config=self.address)

    def pids(self) -> List[int]:
        """The live processes' pids."""
        return [p.proc.pid for p in self.processes if p.alive()]

    def close(self) -> None:
        self._server.stop(0)
        for p in self.processes:
            p.close()


def wanted(options) -> bool:
    """True for the DirectRunner in ``multi_processing`` mode with no environment of the user's."""
    from apache_beam.options.pipeline_options import DirectOptions, PortableOptions
    from pipelines.executors.beam import is_direct_runner
    return (is_direct_runner(options)
            and options.view_as(DirectOptions).direct_running_mode == "multi_processing"
            and not options.view_as(PortableOptions).environment_type)


@contextlib.contextmanager
def warm_options(options) -> Iterator[Any]:
    """``options`` with a :class:`WarmWorkers` pool as their ``EXTERNAL`` environment while the block runs
    (:func:`wanted` options only; others are yielded unchanged). The pool is closed on every exit."""
    if not wanted(options):
        yield options
        return
    from apache_beam.options.pipeline_options import DirectOptions
    lost: List[str] = []
    previous = None
    if threading.current_thread() is threading.main_thread():   # else no handler: a lost round waits
        def raise_lost(signum, frame) -> None:
            raise WorkerLost(lost[-1])
        previous = signal.signal(signal.SIGUSR1, raise_lost)

    def on_lost(message: str) -> None:     # a reader thread: the main thread waits inside Beam's runner
        lost.append(message)
        if previous is not None:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
    pool = WarmWorkers(options.view_as(DirectOptions).direct_num_workers or os.cpu_count() or 1, on_lost)
    try:
        with _quiet_about_a_lost_worker():
            yield pool.options(options)
    finally:
        pool.close()
        if previous is not None:
            signal.signal(signal.SIGUSR1, previous)


#: Beam's runner threads that read a worker's control and data streams: they die with a gRPC error, and
#: print its traceback, when the worker process is gone; and what Beam's runner logs then, by logger.
#: WorkerLost says it in one line instead.
_STREAM_READERS = ("beam_control_read", "read_grpc_client_inputs")
#: A gRPC server's own thread (``grpc._server._serve``) can still ask for the next call while the runner
#: shuts that server down after the lost worker; gRPC then raises this in the thread (a race in gRPC's
#: shutdown, harmless: the server is going away). Seen in 2 of 5 runs of test_beam_stop's lost worker.
_SERVER_SHUTDOWN_RACE = (ValueError, "(_serve)", "server must be started and not shutting down")
_LOST_STREAM_LOGS = {"apache_beam.runners.worker.data_plane": "Failed to read inputs in the data plane",
                     "apache_beam.runners.portability.fn_api_runner.worker_handlers": "Error closing worker_handler"}


class _Drop:
    """A logging filter: drops records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def filter(self, record) -> bool:
        return not record.getMessage().startswith(self.prefix)


def _is_the_server_shutdown_race(args) -> bool:
    error, thread_suffix, message = _SERVER_SHUTDOWN_RACE
    name = args.thread.name if args.thread is not None else ""
    return (issubclass(args.exc_type, error) and name.endswith(thread_suffix)
            and str(args.exc_value).startswith(message))


def _ignore_the_server_shutdown_race() -> None:
    """Drop :data:`_SERVER_SHUTDOWN_RACE` for the rest of the process (installed once). Not scoped to a round:
    the server's thread can raise after the runner's ``stop()`` returned and the round's scope has closed."""
    hook = threading.excepthook
    if getattr(hook, "drops_the_server_shutdown_race", False):
        return

    def excepthook(args) -> None:
        if not _is_the_server_shutdown_race(args):
            hook(args)
    excepthook.drops_the_server_shutdown_race = True
    threading.excepthook = excepthook


@contextlib.contextmanager
def _quiet_about_a_lost_worker() -> Iterator[None]:
    import logging

    import grpc
    _ignore_the_server_shutdown_race()
    hook = threading.excepthook

    def excepthook(args) -> None:
        name = args.thread.name if args.thread is not None else ""
        if not (issubclass(args.exc_type, grpc.RpcError) and name in _STREAM_READERS):
            hook(args)
    filters = [(logging.getLogger(name), _Drop(prefix)) for name, prefix in _LOST_STREAM_LOGS.items()]
    threading.excepthook = excepthook
    for logger, drop in filters:
        logger.addFilter(drop)
    try:
        yield
    finally:
        threading.excepthook = hook
        for logger, drop in filters:
            logger.removeFilter(drop)


# --------------------------------------------------------------------------- the worker process
def _serve() -> None:
    """A warm worker process: one harness at a time, for each ``start`` line on stdin, until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "w", buffering=1)     # messages; anything else printed goes to stderr
    os.dup2(2, 1)
    import logging

    from core.native_logs import quiet_tensorflow_import
    quiet_tensorflow_import()                             # the first round's learner imports it

    from apache_beam.portability.api import beam_fn_api_pb2
    from apache_beam.runners.worker import sdk_worker

    from pipelines.beam.learner import forget_learners
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    write_lock = threading.Lock()

    def reply(message: Dict[str, Any]) -> None:
        with write_lock:
            replies.write(json.dumps(message) + "\n")

    harness: Optional[threading.Thread] = None

    def run(h, worker_id: str) -> None:
        try:
            h.run()
        finally:
            reply({"idle": worker_id})

    for line in sys.stdin:
        request = beam_fn_api_pb2.StartWorkerRequest.FromString(base64.b64decode(json.loads(line)["start"]))
        try:
            if harness is not None:
                harness.join()                  # the dispatcher sends no request to a busy process
            forget_learners()                   # each round restores its learner from durable state
            h = sdk_worker.SdkHarness(request.control_endpoint.url, worker_id=request.worker_id)
            harness = threading.Thread(target=run, args=(h, request.worker_id), name="harness", daemon=True)
            harness.start()
            reply({"started": request.worker_id})
        except Exception:  # noqa: BLE001 - the runner gets the traceback as StartWorker's error
            reply({"error": traceback.format_exc()})


if __name__ == "__main__":
    from core.fast_exit import exit_now
    _serve()
    exit_now(0)
