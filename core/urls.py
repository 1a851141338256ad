"""Run-directory and store locations: a local path or an fsspec URL.

Every durable artefact (replay store, checkpoints, metrics) is rooted at a
location given by the user as a local path (``runs/cartpole``) or an fsspec
URL (``memory://x``, ``file:///tmp/x``, ``gs://bucket/x``, ``s3://bucket/x``).
This module is the one place that turns such a string into an fsspec
filesystem plus a path, and rejects unsupported schemes with a one-line error.

Example::

    fs, path = resolve("memory://runs/a")
    fs.makedirs(path, exist_ok=True)
    join("gs://b/run", "replay")  # -> "gs://b/run/replay"
"""
from __future__ import annotations

import os
import uuid
from typing import Dict, Tuple

import fsspec
from fsspec.implementations.local import LocalFileSystem

#: Schemes DataBloom supports. Object stores need their fsspec package (gcsfs, s3fs).
SUPPORTED_SCHEMES = ("file", "memory", "gs", "gcs", "s3")


class LocationError(ValueError):
    """A path or URL DataBloom cannot use (unsupported scheme, not a store, ...)."""


def scheme_of(url: str) -> str:
    """The URL scheme, ``"file"`` for plain paths."""
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def is_remote(url: str) -> bool:
    """True for object stores reachable from other machines (gs, s3)."""
    return scheme_of(url) in ("gs", "gcs", "s3")


def normalize(url: str) -> str:
    """Absolute local paths for plain paths; URLs unchanged (without trailing '/')."""
    url = str(url)
    scheme = scheme_of(url)
    if scheme not in SUPPORTED_SCHEMES:
        raise LocationError(
            f"unsupported URL scheme {scheme!r} in {url!r}; valid: local path or "
            + ", ".join(f"{s}://" for s in SUPPORTED_SCHEMES))
    if "://" not in url:
        return os.path.abspath(os.path.expanduser(url))
    if scheme == "file":
        return os.path.abspath(url.split("://", 1)[1])
    return url.rstrip("/")


def resolve(url: str) -> Tuple[fsspec.AbstractFileSystem, str]:
    """fsspec filesystem and the path inside it for ``url``."""
    url = normalize(url)
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:  # e.g. gcsfs not installed
        raise LocationError(f"cannot open {url!r}: {e}") from None
    return fs, path


def join(url: str, *parts: str) -> str:
    """Join path components onto a path or URL with '/'."""
    url = normalize(url)
    if "://" not in url:
        return os.path.join(url, *parts)
    return "/".join([url.rstrip("/"), *[p.strip("/") for p in parts]])


def kvstore_spec(url: str) -> Dict[str, str]:
    """tensorstore kvstore spec of the folder ``url`` (local path, s3:// or gs://).

    s3:// takes an S3-compatible server from the environment (``s3_endpoint_options``), as
    s3fs does, so tensorstore and fsspec reach the same objects. memory:// has no tensorstore
    equivalent (tensorstore's memory kvstore is per Context), so it raises LocationError.
    """
    url = normalize(url)
    scheme = scheme_of(url)
    if scheme == "file":
        return {"driver": "file", "path": url.rstrip("/") + "/"}
    if scheme in ("s3", "gs", "gcs"):
        bucket, _, key = url.split("://", 1)[1].partition("/")
        spec = {"driver": "s3" if scheme == "s3" else "gcs", "bucket": bucket, "path": key.strip("/") + "/"}
        return {**spec, **s3_endpoint_options()} if scheme == "s3" else spec
    raise LocationError(f"{url!r} has no tensorstore kvstore; valid: a local path, s3:// or gs://")


def write_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Write a whole small object atomically and durably.

    Local disk: a temp file, fsynced, renamed over ``path``, then the directory
    fsynced, so readers see the old content or the new one, never a torn file,
    and the new one survives a crash once this returns. Object stores and
    memory://: one put, which is atomic there.
    """
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data)
        return
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)


def s3_endpoint_options() -> Dict[str, str]:
    """Options of tensorstore's ``s3`` kvstore for an S3-compatible server named in the environment.

    ``AWS_ENDPOINT_URL_S3`` (else ``AWS_ENDPOINT_URL``) is the server (MinIO, Ceph, moto, ...)
    and ``AWS_REGION`` (else ``AWS_DEFAULT_REGION``) its signing region; both are ignored when
    ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true``. botocore, hence s3fs, reads the same variables,
    so replay data (fsspec) and commit-log entries (tensorstore, which reads none of them) reach
    the same server. Returns {} without an endpoint variable (AWS S3 itself: tensorstore finds
    the bucket's region). Endpoints set only in ``~/.aws/config`` reach s3fs but not tensorstore.

    Example::

        os.environ["AWS_ENDPOINT_URL"] = "http://localhost:9000"
        s3_endpoint_options()  # -> {"endpoint": "http://localhost:9000"} (+ "aws_region" if set)
    """
    env = os.environ
    if env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
        return {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return {}
    options = {"endpoint": endpoint.rstrip("/")}
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        options["aws_region"] = region
    return options
