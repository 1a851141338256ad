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
import re
import threading
import uuid
from typing import Any, Callable, Dict, Tuple

import fsspec
from fsspec.implementations.local import LocalFileSystem

#: Schemes DataBloom supports. Object stores need their fsspec package (gcsfs, s3fs).
SUPPORTED_SCHEMES = ("file", "memory", "gs", "gcs", "s3")
OBJECT_STORE_SCHEMES = ("gs", "gcs", "s3")
#: What every refusal names as valid.
VALID_FORMS = "a local path, file:///ABS/PATH, memory://NAME, s3://BUCKET/PATH or gs://BUCKET/PATH"
#: A reachability probe of an object store answers within this many seconds, or the run is refused.
PROBE_TIMEOUT_S = 20.0

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(.*)", re.S)
# S3 bucket names: 3-63 of a-z 0-9 . -, starting and ending with a letter or digit. GCS also allows
# '_' and names up to 222 characters with dots.
_BUCKET = {"s3": re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"),
           "gs": re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")}


class LocationError(ValueError):
    """A path or URL DataBloom cannot use (unsupported scheme, not a store, ...)."""


def scheme_of(url: str) -> str:
    """The URL scheme, ``"file"`` for plain paths."""
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def is_remote(url: str) -> bool:
    """True for object stores reachable from other machines (gs, s3)."""
    return scheme_of(url) in OBJECT_STORE_SCHEMES


def _refuse(url: str, problem: str) -> LocationError:
    return LocationError(f"{url!r} {problem}; valid: {VALID_FORMS}")


def parse(url: str) -> str:
    """The one parser of run directories, stores and datasets: ``url`` normalized, or LocationError.

    Accepted, exactly:

    * a local path without a scheme (``runs/a``, ``/data/a``, ``~/a``) -> its absolute path;
    * ``file:///ABS/PATH`` -> ``/ABS/PATH``;
    * a relative path that contains ``:/`` is refused (a URL typed without its scheme's two
      slashes, or pasted after a folder); the escape for a local folder really named so is its
      absolute path (``/data/a:/b``, or ``file:///data/a:/b``), which cannot be read as a URL;
    * ``memory://NAME[/PATH]`` (tests, one process);
    * ``s3://BUCKET[/PATH]``, ``gs://BUCKET[/PATH]`` (``gcs://`` too) with a valid bucket name and
      no empty, ``.`` or ``..`` path segments -> without the trailing ``/``; schemes are lower-cased.

    Everything else is refused with one line naming what is wrong and :data:`VALID_FORMS`, before
    anything is written: an empty string, an unknown scheme (``hdfs://x``), a scheme and nothing
    else (``gs://``, ``s3:``), an empty bucket (``s3:///x``), one slash (``s3:/bucket/x``), no
    slash (``s3:bucket``), a query or fragment, and a relative path that merely looks like a URL
    because it contains ``:/`` (``gs:/x``, ``runs/s3://b``). Normalized forms parse to themselves.

    Example::

        parse("gs://my-bucket/runs/a/")   # -> "gs://my-bucket/runs/a"
        parse("runs/a")                   # -> "/home/me/runs/a"
        parse("gs://")                    # LocationError: 'gs://' has no bucket; valid: ...
    """
    url = str(url)
    if not url.strip():
        raise _refuse(url, "is empty")
    if url != url.strip() or "\x00" in url:
        raise _refuse(url, "has leading or trailing whitespace or a NUL character")
    match = _SCHEME.fullmatch(url)
    if match is None or not match.group(2).startswith("//"):
        return _parse_local(url, match)
    scheme, body = match.group(1).lower(), match.group(2)[2:]
    if scheme not in SUPPORTED_SCHEMES:
        raise _refuse(url, f"has the unsupported URL scheme {scheme!r} (supported: "
                           + ", ".join(f"{s}://" for s in SUPPORTED_SCHEMES) + ")")
    if "?" in body or "#" in body:
        raise _refuse(url, "has a query or fragment ('?' or '#')")
    if scheme == "file":
        if not body.startswith("/"):
            raise _refuse(url, "is not file:// followed by an absolute path")
        return os.path.normpath(body)
    if not body.strip("/"):
        raise _refuse(url, "is only a scheme" if scheme == "memory" else "has no bucket")
    if scheme == "memory":
        return f"memory://{body.rstrip('/')}"
    return _parse_object_store(url, scheme, body)


def _parse_local(url: str, match) -> str:
    """A plain path: a relative one is refused where it looks like a URL (``scheme:`` first, or ``:/``)."""
    if url.startswith("/"):
        return os.path.normpath(url)
    if match is not None:
        scheme, rest = match.group(1).lower(), match.group(2)
        if rest.startswith("/"):
            raise _refuse(url, f"has one slash after {scheme + ':'!r}; a URL needs two ({scheme}://...)")
        if scheme in SUPPORTED_SCHEMES or not rest:
            raise _refuse(url, f"looks like a URL without '//' (did you mean {scheme}://{rest}?)")
    if ":/" in url:
        raise _refuse(url, "is a relative path that contains ':/' (a URL pasted into a path?); a folder "
                           "really named so is given by its absolute path")
    return os.path.abspath(os.path.expanduser(url))


def _parse_object_store(url: str, scheme: str, body: str) -> str:
    bucket, _, key = body.partition("/")
    family = "s3" if scheme == "s3" else "gs"
    if not bucket:
        raise _refuse(url, "has no bucket (an empty name before the path)")
    if not _BUCKET[family].fullmatch(bucket) or ".." in bucket:
        raise _refuse(url, f"has an invalid bucket name {bucket!r} (3-63 lower-case letters, digits, '.', '-'"
                           + (", '_'" if family == "gs" else "") + ")")
    key = key.rstrip("/")
    if key and any(part in ("", ".", "..") for part in key.split("/")):
        raise _refuse(url, "has an empty, '.' or '..' path segment")
    return f"{scheme}://{bucket}" + (f"/{key}" if key else "")


def normalize(url: str) -> str:
    """Absolute local paths for plain paths; URLs without trailing '/'. See :func:`parse` (the same)."""
    return parse(url)


def probe(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Check once, before a run writes anything, that an object store answers; LocationError otherwise.

    Local paths and ``memory://`` are not probed (local problems surface as one-line OSErrors where
    the run directory is locked). For ``s3://`` and ``gs://`` one listing of at most one key under
    the location is made with short connect/read timeouts and no retries, through the same fsspec
    filesystem (and so the same credentials chain and ``AWS_ENDPOINT_URL``) that the run uses. It
    names which of these went wrong, within ``timeout_s`` whatever the SDK does meanwhile:

    * the package for the scheme is not installed (``pip install 'databloom[s3]'``);
    * no credentials were found, or the store refused them (``AccessDenied``, unknown key);
    * the bucket does not exist;
    * the endpoint cannot be reached, or did not answer within ``timeout_s``.

    A store that goes away mid-run is a different case: the run waits it out (retries).
    """
    url = parse(url)
    scheme = scheme_of(url)
    if scheme not in OBJECT_STORE_SCHEMES:
        return
    list_one = _s3_lister(url) if scheme == "s3" else _gcs_lister(url)
    outcome: Dict[str, BaseException] = {}

    def attempt() -> None:
        try:
            list_one()
        except BaseException as e:  # noqa: BLE001 - classified below, in the caller's thread
            outcome["error"] = e

    worker = threading.Thread(target=attempt, name=f"probe {url}", daemon=True)  # daemon: a hung SDK
    worker.start()                                                                # cannot hold the exit
    worker.join(timeout_s)
    if worker.is_alive():
        raise LocationError(f"{url}: no answer from {_endpoint_name(scheme)} within {timeout_s:.0f} s; "
                            "valid: a reachable store (check the network, or AWS_ENDPOINT_URL for an "
                            "S3-compatible server)")
    error = outcome.get("error")
    if error is not None and not _is_store_error(error):
        raise error   # a bug, not the store's answer: keep its traceback
    if error is not None:
        raise LocationError(f"{url}: {_probe_problem(scheme, url, error)}") from None


def _endpoint_name(scheme: str) -> str:
    if scheme == "s3":
        endpoint = s3_endpoint_options().get("endpoint")
        return f"the S3 endpoint {endpoint}" if endpoint else "AWS S3"
    return "Google Cloud Storage"


def _bucket_and_key(url: str) -> Tuple[str, str]:
    bucket, _, key = url.split("://", 1)[1].partition("/")
    return bucket, key


def _s3_lister(url: str) -> Callable[[], object]:
    try:
        import s3fs
    except ImportError:
        raise LocationError(f"{url}: s3:// needs s3fs; valid: pip install 'databloom[s3]'") from None
    fs = s3fs.S3FileSystem(skip_instance_cache=True, config_kwargs={
        "connect_timeout": 5, "read_timeout": 10, "retries": {"max_attempts": 1, "mode": "standard"}})
    fs.retries = 1   # s3fs's own retry loop, around botocore's
    bucket, key = _bucket_and_key(url)
    return lambda: fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=f"{key}/" if key else "", MaxKeys=1)


def _gcs_lister(url: str) -> Callable[[], object]:
    try:
        import gcsfs
    except ImportError:
        raise LocationError(f"{url}: gs:// needs gcsfs; valid: pip install 'databloom[gcs]'") from None
    fs = gcsfs.GCSFileSystem(skip_instance_cache=True, retries=1)
    bucket, _ = _bucket_and_key(url)
    return lambda: fs.ls(bucket, detail=False)


def _is_store_error(error: BaseException) -> bool:
    """The store's or the network's answer (OSError, the SDKs' own errors), as opposed to a bug."""
    module = type(error).__module__.split(".")[0]
    return isinstance(error, (OSError, TimeoutError)) or module in ("botocore", "aiobotocore", "aiohttp",
                                                                    "google", "gcsfs")


def _probe_problem(scheme: str, url: str, error: BaseException) -> str:
    """One line saying which of: no credentials, credentials refused, no bucket, endpoint unreachable."""
    bucket, _ = _bucket_and_key(url)
    kind = type(error).__name__
    text = (str(error).strip().splitlines() or [kind])[0]
    if kind in ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError"):
        where = ("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance role" if scheme == "s3"
                 else "GOOGLE_APPLICATION_CREDENTIALS, or gcloud auth application-default login")
        return f"no credentials were found ({text}); valid: {where}"
    if isinstance(error, PermissionError):
        return (f"the store refused these credentials for bucket {bucket!r} ({text}); "
                "valid: credentials allowed to list it")
    if isinstance(error, FileNotFoundError):
        return f"bucket {bucket!r} does not exist at {_endpoint_name(scheme)}; valid: an existing bucket"
    return f"cannot reach {_endpoint_name(scheme)} ({kind}); valid: a reachable store"


def resolve(url: str) -> Tuple[fsspec.AbstractFileSystem, str]:
    """fsspec filesystem and the path inside it for ``url``.

    Object stores get no listings cache: s3fs/gcsfs otherwise keep every folder listing for the
    life of the process and answer ``exists``/``info`` (and s3fs's size probe before a read) from
    it, so an object written after a listing (a commit-log entry, by this process or another)
    looked absent for good.
    """
    url = normalize(url)
    options = {"use_listings_cache": False} if scheme_of(url) in ("s3", "gs", "gcs") else {}
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as e:  # e.g. gcsfs not installed
        raise LocationError(f"cannot open {url!r}: {e}") from None
    return fs, path


def join(url: str, *parts: str) -> str:
    """Join path components onto a path or URL with '/'."""
    url = normalize(url)
    if "://" not in url:
        return os.path.join(url, *parts)
    return "/".join([url.rstrip("/"), *[p.strip("/") for p in parts]])


def kvstore_spec(url: str) -> Dict[str, Any]:
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
        return {**spec, **s3_endpoint_options(), **s3_credentials_option()} if scheme == "s3" else spec
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


def s3_credentials_option() -> Dict[str, Any]:
    """``{"aws_credentials": {"type": "environment"}}`` when the keys are in the environment, else {}.

    The same credentials tensorstore's default chain would pick first, but without the chain's
    other providers, which log ``E... AuthCredentialsProvider ... Failed to open file ~/.aws/config``
    lines (five per store opened, 85 in a 70 s run) when no such file exists, as on most cluster
    hosts. Without the keys in the environment the default chain (profiles, instance roles) stays.
    """
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return {"aws_credentials": {"type": "environment"}}
    return {}


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
