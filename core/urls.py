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
from typing import Tuple

import fsspec

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
