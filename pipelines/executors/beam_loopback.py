"""Beam's local runner servers on the loopback interface only, not on every interface.

Beam's ``FnApiRunner`` (the DirectRunner's engine, :func:`pipelines.executors.beam.runner_for`) talks to
its SDK worker processes over four gRPC servers: control, data, state and logging; a per-pipeline
worker process (``SubprocessSdkWorker``) adds a logging server of its own. Beam 2.78 binds each to
``[::]:0``: every interface of the machine, with no authentication, for as long as the pipeline runs
(``fn_api_runner/worker_handlers.py`` ``GrpcServer``, ``local_job_service.py`` ``SubprocessSdkWorker.run``).
Anyone who reaches the machine could connect to the control port as a worker and be sent bundles
(trajectories, parameters), or read and write the runner's state. Yet every client of these servers
is a worker process on the same machine, and Beam hands the workers the address ``localhost:PORT``.

:func:`install` makes those two Beam modules bind ``localhost:PORT`` instead of ``[::]:PORT`` (gRPC
binds ``localhost:0`` on one port for both loopback addresses, 127.0.0.1 and ::1): exactly what the
workers connect to. It replaces the ``grpc`` name in those two modules only, with :class:`_LoopbackGrpc`,
whose ``server()`` returns a server whose ``add_insecure_port`` rewrites a wildcard host; everything
else is gRPC's own. Beam's other servers (a job service, an expansion service, a worker pool) are not
started by DataBloom, and runners other than the DirectRunner (Dataflow) do not run these modules here.
"""
from __future__ import annotations

import threading
from typing import Any

#: The host Beam's local servers bind: the address Beam gives its workers (``localhost:PORT``).
LOOPBACK_HOST = "localhost"
#: Hosts that mean "every interface" in a gRPC listening address.
WILDCARD_HOSTS = ("[::]", "0.0.0.0", "")

_lock = threading.Lock()


def loopback_address(address: str) -> str:
    """``address`` with a wildcard host (``[::]:0``, ``0.0.0.0:5000``, ``:0``) replaced by the loopback host."""
    host, sep, port = address.rpartition(":")
    return f"{LOOPBACK_HOST}:{port}" if sep and host in WILDCARD_HOSTS else address


class _LoopbackServer:
    """A ``grpc.Server`` whose listening ports are bound to the loopback host (:func:`loopback_address`)."""

    def __init__(self, server):
        self._server = server

    def add_insecure_port(self, address: str) -> int:
        port = self._server.add_insecure_port(loopback_address(address))
        if not port:      # gRPC returns 0 when nothing could be bound; Beam would then hand out port 0
            raise RuntimeError(f"could not bind a Beam runner server to {loopback_address(address)}")
        return port

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class _LoopbackGrpc:
    """The ``grpc`` module as the Beam modules see it after :func:`install`: ``server()`` is loopback-only."""

    def __init__(self, grpc_module):
        self._grpc = grpc_module

    def server(self, *args, **kwargs) -> _LoopbackServer:
        return _LoopbackServer(self._grpc.server(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grpc, name)


def install() -> None:
    """Bind Beam's ``FnApiRunner`` and per-pipeline worker servers to the loopback host (idempotent)."""
    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.portability.fn_api_runner import worker_handlers
    with _lock:
        for module in (worker_handlers, local_job_service):
            if not isinstance(module.grpc, _LoopbackGrpc):
                module.grpc = _LoopbackGrpc(module.grpc)
