"""Where the inference server listens and how an actor proves it belongs to the run.

The server is an open door into the learner, so three rules hold:

* **no wildcard by default.** It binds the one address actors can reach:
  a unix socket in a private directory (mode 0700) for the local executor,
  ``127.0.0.1`` for a Dask LocalCluster, and the local interface that routes
  to the scheduler when joining a remote Dask cluster (the address the
  kernel would use to send to the scheduler: a connected UDP socket's
  ``getsockname``, no packet is sent). ``inference_server.bind_host``
  overrides it; if that is a wildcard (``0.0.0.0``, ``::``) the server
  listens on every interface but actors are still handed the routed address,
  never ``0.0.0.0:PORT``, which a remote worker would dial on its own host.
* **every stream carries the run's secret.** A per-run token
  (``secrets.token_urlsafe(32)``, 256 bits) goes to actors inside their
  :class:`ServerEndpoint`, travels as gRPC metadata ``databloom-token`` and is
  compared with :func:`hmac.compare_digest` (constant time) before the server
  reads a byte of the stream.
* **TLS when the user gives a certificate.** ``inference_server.tls_cert`` /
  ``tls_key`` (PEM files) make the server use ``grpc.ssl_server_credentials``;
  actors trust that certificate as their root (a self-signed or a private-CA
  certificate whose name matches the address they dial).

Example::

    plan = listen_plan(cfg)                     # ListenPlan(bind="127.0.0.1:0", dial_host="127.0.0.1", ...)
    token = new_token()
    server = InferenceServer(plan.bind, payload, spec, token=token, tls=load_tls(cert, key)).start()
    endpoint = ServerEndpoint(plan.dial_address(server.port), token, root_certificates=cert_bytes)
    run_env_actor_task(endpoint, actor_spec)
"""
from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import os
import secrets
import shutil
import socket
import tempfile
import urllib.parse
from typing import Optional, Sequence, Tuple

#: gRPC metadata key of the run token (keys must be lower case)
TOKEN_METADATA = "databloom-token"
_SOCKET_NAME = "inference.sock"


class EndpointError(ValueError):
    """The server cannot be placed or its TLS files cannot be used (one-line message)."""


@dataclasses.dataclass(frozen=True)
class ServerEndpoint:
    """What an env-only actor needs to reach the server: address, run token, trusted TLS root.

    The token is left out of ``repr`` so it never lands in a log or a task name.
    """
    address: str
    token: str = dataclasses.field(repr=False)
    root_certificates: Optional[bytes] = dataclasses.field(default=None, repr=False)

    @property
    def metadata(self) -> Tuple[Tuple[str, str], ...]:
        return ((TOKEN_METADATA, self.token),)


def new_token() -> str:
    """A fresh per-run secret: 32 random bytes, URL-safe base64 (valid gRPC metadata)."""
    return secrets.token_urlsafe(32)


def token_matches(metadata: Optional[Sequence[Tuple[str, object]]], token: str) -> bool:
    """True iff ``metadata`` carries ``token`` under :data:`TOKEN_METADATA` (constant-time compare)."""
    sent = next((v for k, v in (metadata or ()) if k == TOKEN_METADATA), None)
    if sent is None:
        return False
    sent_bytes = sent if isinstance(sent, bytes) else str(sent).encode()
    return hmac.compare_digest(sent_bytes, token.encode())


# -- where to listen -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ListenPlan:
    """``bind``: the address the server listens on; ``dial_host``: the host actors dial (TCP only).

    ``socket_dir`` is the private directory of a unix socket, removed by :meth:`cleanup`.
    """
    bind: str
    dial_host: Optional[str] = None
    socket_dir: Optional[str] = None

    def dial_address(self, port: int) -> str:
        """The address handed to actors once the server holds ``port``."""
        if self.dial_host is None:
            return self.bind
        return f"{_bracket(self.dial_host)}:{int(port)}"

    def cleanup(self) -> None:
        if self.socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


def private_unix_socket() -> ListenPlan:
    """A unix socket address inside a fresh directory only this user can enter (mode 0700)."""
    path = tempfile.mkdtemp(prefix="databloom-inference-")   # mkdtemp creates it 0700
    os.chmod(path, 0o700)                                     # and say so, whatever the platform
    return ListenPlan(bind=f"unix://{os.path.join(path, _SOCKET_NAME)}", socket_dir=path)


def is_wildcard(host: str) -> bool:
    """``0.0.0.0``, ``::``, ``*`` or empty: every interface."""
    if host in ("", "*"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def routed_host(scheduler_address: str) -> str:
    """The local IP of the interface that routes to ``scheduler_address`` (``tcp://host:port``)."""
    parts = urllib.parse.urlsplit(scheduler_address if "://" in scheduler_address else f"tcp://{scheduler_address}")
    host, port = parts.hostname, parts.port or 8786
    if not host:
        raise EndpointError(f"cannot tell the Dask scheduler's host from {scheduler_address!r}; "
                            f"valid: tcp://host:port, or set inference_server.bind_host")
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        if ipaddress.ip_address(sockaddr[0]).is_loopback:
            return sockaddr[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)               # UDP connect: picks the route, sends nothing
            return s.getsockname()[0]
    except OSError as e:
        raise EndpointError(f"cannot find the local interface that routes to the Dask scheduler "
                            f"{scheduler_address} ({e.strerror or e}); set inference_server.bind_host") from None


def listen_plan(executor: str, dask_address: Optional[str], bind_host: Optional[str]) -> ListenPlan:
    """Where the central inference server listens (see module docstring)."""
    if executor == "local" and not bind_host:
        return private_unix_socket()
    reach = routed_host(dask_address) if dask_address else "127.0.0.1"
    if not bind_host:
        return ListenPlan(bind=f"{_bracket(reach)}:0", dial_host=reach)
    return ListenPlan(bind=f"{_bracket(bind_host)}:0", dial_host=reach if is_wildcard(bind_host) else bind_host)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# -- TLS -----------------------------------------------------------------------------------------

def read_pem(path: str, what: str) -> bytes:
    """The bytes of PEM file ``path``; a one-line :class:`EndpointError` if it is missing or not PEM."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise EndpointError(f"{what} {path!r} cannot be read ({e.strerror}); valid: a PEM file") from None
    if b"-----BEGIN " not in data:
        raise EndpointError(f"{what} {path!r} is not a PEM file (no '-----BEGIN' line)")
    return data


def load_tls(cert_path: Optional[str], key_path: Optional[str]) -> Optional[Tuple[bytes, bytes]]:
    """``(certificate chain, private key)`` PEM bytes, or None without TLS; both paths or neither."""
    if not cert_path and not key_path:
        return None
    if not cert_path or not key_path:
        missing = "tls_key" if cert_path else "tls_cert"
        raise EndpointError(f"inference_server.{missing} is not set; TLS needs both tls_cert and tls_key")
    return (read_pem(cert_path, "inference_server.tls_cert"), read_pem(key_path, "inference_server.tls_key"))


def check_config(section) -> None:
    """Config-time checks of the ``inference_server`` section (raises :class:`EndpointError`)."""
    load_tls(section.tls_cert, section.tls_key)
    if section.bind_host is not None and not section.bind_host.strip():
        raise EndpointError("inference_server.bind_host is empty; valid: an IP or host name "
                            "(0.0.0.0 to listen on every interface), or null for the routed default")
