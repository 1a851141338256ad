"""Run-directory lock: at most one trainer writes a run directory at a time.

A trainer takes the lock before it writes anything (``config.json``, replay,
checkpoints) and holds it until it exits, also on an error or Ctrl-C. A second
trainer on the same run directory, new run or ``--resume``, is refused with
:class:`RunDirInUse`, a one-line user error (exit 2 in the CLIs), and writes
nothing.

Example::

    with RunLock("runs/cartpole-dqn"):      # RunDirInUse if another trainer holds it
        train(cfg, "runs/cartpole-dqn")

Two mechanisms, by where the run directory lives:

* **Local disk** (plain path, ``file://``): ``flock(LOCK_EX | LOCK_NB)`` on
  ``<run_dir>/run.lock``, which holds the owner's host, pid and start time for
  the refusal message. The kernel drops the lock when the process dies, also
  on ``kill -9``, so a crashed run never leaves a stale lock and ``--resume``
  works at once; no heartbeat is needed. The file is unlinked on release while
  still locked; an acquirer checks after locking that the path still names the
  inode it locked, so it never holds a lock on a file someone just unlinked.
* **Object stores** (``s3://``, ``gs://``) and ``memory://``: a *lease*
  object ``<run_dir>/run.lock`` (JSON: owner id, host, pid, heartbeat time,
  timeout), created with the exclusive create the commit log uses
  (:class:`core.replay.commit_log.TensorstoreCreator`: a write conditioned on
  the "no value" generation; memory://: check-then-create under a process-wide
  lock). A daemon thread renews the heartbeat every ``timeout_s / 4`` with a
  write conditioned on the generation it last wrote. A lease whose heartbeat
  is older than its ``timeout_s`` (by the acquirer's clock) is stale, left by a
  crashed trainer, and is taken over with a write conditioned on the stale
  generation, so of two acquirers at most one wins. Release deletes the lease
  only if it is still ours. Clocks of the machines must agree to well within
  ``timeout_s`` (default 60 s; the environment variable ``DATABLOOM_RUN_LEASE_S``
  sets it for every trainer started with it, e.g. 15 on a small cluster where a
  crashed client's run should be resumable sooner). The lease also starts a
:class:`core.store_watch.StoreWatch`, which says on stderr when the store stops
answering (the run stalls while its requests retry) and when it answers again.
If the heartbeat cannot renew (the lease was taken over because this process
stalled longer than the timeout), the holder warns once on stderr and marks
``lost``; it does not stop the run by itself.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, Optional, Tuple

from core import urls

LOCK_NAME = "run.lock"
#: Seconds without a heartbeat after which an object-store lease is stale.
DEFAULT_TIMEOUT_S = 60.0
#: Environment variable that overrides :data:`DEFAULT_TIMEOUT_S` (seconds, >= 2).
LEASE_ENV = "DATABLOOM_RUN_LEASE_S"


def lease_timeout_s() -> float:
    """The lease timeout: ``$DATABLOOM_RUN_LEASE_S`` if set, else 60 s; a bad value is a one-line error."""
    text = os.environ.get(LEASE_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 2.0 or value == float("inf"):
        raise urls.LocationError(f"{LEASE_ENV}={text!r} is not a lease timeout; valid: seconds, a number >= 2 "
                                 f"(default {DEFAULT_TIMEOUT_S:.0f})")
    return value


class RunDirInUse(urls.LocationError):
    """Another trainer holds the run directory (one line: who, and what is valid)."""


def _owner_text(info: Dict[str, Any]) -> str:
    since = info.get("acquired")
    when = time.strftime(" since %Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if isinstance(since, (int, float)) else ""
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')}{when}"


def _in_use(url: str, info: Dict[str, Any], expires_in: Optional[float] = None) -> RunDirInUse:
    """The refusal; with ``expires_in`` (object-store leases), when a dead holder's lease lapses and how to
    take it sooner (delete the lease object, only when that trainer is known to be dead)."""
    if expires_in is None:
        return RunDirInUse(f"run directory {url} is in use by another trainer ({_owner_text(info)}); "
                           "valid: wait for it to finish, or another --run-dir")
    return RunDirInUse(f"run directory {url} is in use by another trainer ({_owner_text(info)}); if it is no "
                       f"longer running, its lease expires in {max(expires_in, 0.0):.0f} s (no heartbeat since "
                       f"{_ago(info)}); valid: wait for it to finish, retry after the lease expires, delete "
                       f"{urls.join(url, LOCK_NAME)} if that trainer is certainly dead, or another --run-dir")


def _ago(info: Dict[str, Any]) -> str:
    beat = info.get("heartbeat")
    return time.strftime("%H:%M:%S UTC", time.gmtime(beat)) if isinstance(beat, (int, float)) else "?"


def _unusable(url: str, e: OSError) -> urls.LocationError:
    reason = "it is a file" if os.path.isfile(url) else (e.strerror or type(e).__name__)
    return urls.LocationError(f"run directory {url} cannot be written: {reason}; "
                              "valid: a writable directory, or a path where one can be created")


def _identity() -> Dict[str, Any]:
    return {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid()}


class _FileLock:
    """Local disk: flock on ``<dir>/run.lock`` (released by the kernel when the process dies)."""

    def __init__(self, url: str):
        self.url = url
        self.path = os.path.join(url, LOCK_NAME)
        self.fd: Optional[int] = None
        self._created: list = []   # directories this lock created, deepest first (removed if left empty)

    def acquire(self) -> None:
        try:
            self._created = _missing_dirs(self.url)
            fd = self._open_locked()
            self.fd = fd
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({**_identity(), "acquired": time.time()}).encode(), 0)
        except OSError as e:   # a file in the way, under a file, read-only, no permission, ...
            raise _unusable(self.url, e) from None

    def _open_locked(self) -> int:
        """Open and flock ``run.lock``, retrying while a holder is unlinking it (or its empty run dir)."""
        import fcntl
        for _ in range(100):
            os.makedirs(self.url, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                continue           # the holder removed its empty run dir between our makedirs and open
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                info = self._read(fd)
                os.close(fd)
                raise _in_use(self.url, info) from None
            except BaseException:
                os.close(fd)
                raise
            if self._still_linked(fd):
                return fd
            os.close(fd)           # the holder unlinked it between our open and flock: lock the new file
        raise OSError(errno.EAGAIN, "the lock file keeps being replaced", self.path)

    def _still_linked(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    @staticmethod
    def _read(fd: int) -> Dict[str, Any]:
        try:
            return json.loads(os.pread(fd, 4096, 0) or b"{}")
        except (OSError, ValueError):
            return {}

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)   # while still locked: see the module docstring
        except OSError:
            pass
        os.close(self.fd)          # closing drops the flock
        self.fd = None
        for d in self._created:    # a run that wrote nothing (refused, failed early) leaves no trace
            try:
                os.rmdir(d)
            except OSError:        # not empty (the run wrote there) or already gone
                break


def _missing_dirs(path: str) -> list:
    """The directories ``os.makedirs(path)`` would create, deepest first."""
    missing = []
    while path and not os.path.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


class _MemoryLeaseStore:
    """memory://: compare-and-swap on an fsspec memory file under a process-wide lock."""

    _LOCK = threading.Lock()

    def __init__(self, url: str):
        self.fs, root = urls.resolve(url)
        self.path = f"{root}/{LOCK_NAME}"

    def create(self, data: bytes) -> Optional[bytes]:
        with self._LOCK:
            if self.fs.exists(self.path):
                return None
            self.fs.pipe_file(self.path, data)
            return data

    def read(self) -> Optional[Tuple[bytes, bytes]]:
        with self._LOCK:
            if not self.fs.exists(self.path):
                return None
            data = self.fs.cat_file(self.path)
            return data, data   # the content is its own generation: every lease differs (owner, time)

    def replace(self, data: Optional[bytes], generation: bytes) -> Optional[bytes]:
        with self._LOCK:
            current = self.fs.cat_file(self.path) if self.fs.exists(self.path) else None
            if current != generation:
                return None
            if data is None:
                self.fs.rm_file(self.path)
                return b""
            self.fs.pipe_file(self.path, data)
            return data


class _KvLeaseStore:
    """Object stores: tensorstore kvstore writes conditioned on a generation (as the commit log)."""

    def __init__(self, kvstore_spec: Dict[str, Any]):
        from core.replay.commit_log import TensorstoreCreator
        self._creator = TensorstoreCreator(kvstore_spec)
        self.kv = self._creator.kv

    def create(self, data: bytes) -> Optional[bytes]:
        # TensorstoreCreator.create's conditional write, keeping the new generation for renewals.
        stamp = self.kv.write(LOCK_NAME, data, if_equal=self._creator.no_value).result()
        return stamp.generation or None

    def probe(self):
        """One small read, as a future (:class:`core.store_watch.StoreWatch`)."""
        return self.kv.read(LOCK_NAME)

    def read(self) -> Optional[Tuple[bytes, bytes]]:
        r = self.kv.read(LOCK_NAME).result()
        return None if r.state != "value" else (bytes(r.value), r.stamp.generation)

    def replace(self, data: Optional[bytes], generation: bytes) -> Optional[bytes]:
        stamp = self.kv.write(LOCK_NAME, data, if_equal=generation).result()
        if data is None:
            return b""
        return stamp.generation or None   # an unmet condition returns the unknown (empty) generation


class _Lease:
    """A lease object with a heartbeat on a :class:`_KvLeaseStore` or :class:`_MemoryLeaseStore`."""

    def __init__(self, url: str, store, timeout_s: float, heartbeat_s: Optional[float],
                 clock: Callable[[], float]):
        self.url, self.store, self.timeout_s, self.clock = url, store, timeout_s, clock
        self.heartbeat_s = timeout_s / 4 if heartbeat_s is None else heartbeat_s
        self.info = _identity()
        self.generation: Optional[bytes] = None
        self.lost = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._watch = None               # core.store_watch.StoreWatch on object stores
        self._mutex = threading.Lock()   # heartbeat vs release

    def _payload(self) -> bytes:
        now = self.clock()
        return json.dumps({**self.info, "heartbeat": now, "timeout_s": self.timeout_s}).encode()

    def acquire(self) -> None:
        self.info["acquired"] = self.clock()
        self.generation = self.store.create(self._payload())
        if self.generation is None:
            self._take_over_if_stale()
        if self.heartbeat_s > 0:
            self._thread = threading.Thread(target=self._beat, name=f"run-lock {self.url}", daemon=True)
            self._thread.start()
            if hasattr(self.store, "probe"):     # says when the store stops answering (the run stalls)
                from core.store_watch import StoreWatch
                self._watch = StoreWatch(self.url, self.store.probe).start()

    def _take_over_if_stale(self) -> None:
        current = self.store.read()
        if current is None:   # released between our create and read: try once more
            self.generation = self.store.create(self._payload())
            if self.generation is not None:
                return
            current = self.store.read() or (b"{}", b"")
        data, generation = current
        try:
            held = json.loads(data)
            age = self.clock() - float(held["heartbeat"])
            timeout = float(held.get("timeout_s", self.timeout_s))
        except (ValueError, KeyError, TypeError):
            held, age, timeout = {}, float("inf"), 0.0   # unreadable lease: nobody can be renewing it
        if age <= timeout:
            raise _in_use(self.url, held, expires_in=timeout - age)
        self.generation = self.store.replace(self._payload(), generation)
        if self.generation is None:   # another acquirer took the stale lease first
            raise _in_use(self.url, json.loads((self.store.read() or (b"{}", b""))[0]))

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with self._mutex:
                if self.generation is None or self._stop.is_set():
                    return
                try:
                    new = self.store.replace(self._payload(), self.generation)
                except Exception as e:  # noqa: BLE001 - a transient store error: retry next beat
                    print(f"warning: run lock heartbeat on {self.url} failed: {e}", file=sys.stderr)
                    continue
                if new is None:
                    self.lost = True
                    self.generation = None
                    print(f"warning: the run lock on {self.url} was taken over by another trainer "
                          f"(no heartbeat for {self.timeout_s:.0f} s)", file=sys.stderr)
                    return
                self.generation = new

    def release(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        with self._mutex:
            if self.generation is not None:
                try:
                    self.store.replace(None, self.generation)   # deletes only if still ours
                except Exception:  # noqa: BLE001 - an unreleased lease expires after timeout_s
                    pass
                self.generation = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


class RunLock:
    """Exclusive use of a run directory (see the module docstring); a context manager.

    Args:
        url: the run directory, a local path or fsspec URL.
        timeout_s: object stores: seconds without a heartbeat after which a lease is stale (default
            :func:`lease_timeout_s`: ``$DATABLOOM_RUN_LEASE_S`` or 60).
        heartbeat_s: object stores: seconds between heartbeats (default ``timeout_s / 4``; 0 = none).
        clock: object stores: wall-clock seconds (injectable for tests).
    """

    def __init__(self, url: str, timeout_s: Optional[float] = None, heartbeat_s: Optional[float] = None,
                 clock: Callable[[], float] = time.time):
        self.url = urls.normalize(url)
        timeout_s = lease_timeout_s() if timeout_s is None else timeout_s
        self._args = (timeout_s, heartbeat_s, clock)
        self._impl: Any = _FileLock(self.url) if urls.scheme_of(self.url) == "file" else None
        self.held = False

    def _lease(self) -> "_Lease":
        store = (_MemoryLeaseStore(self.url) if urls.scheme_of(self.url) == "memory"
                 else _KvLeaseStore(urls.kvstore_spec(self.url)))
        return _Lease(self.url, store, *self._args)

    @property
    def lost(self) -> bool:
        """True once an object-store lease was taken over by another trainer."""
        return bool(getattr(self._impl, "lost", False))

    def acquire(self) -> "RunLock":
        """Take the lock; raises RunDirInUse (held) or LocationError (cannot write there)."""
        try:
            if self._impl is None:
                self._impl = self._lease()
            self._impl.acquire()
        except urls.LocationError:
            raise
        except (ValueError, OSError) as e:   # tensorstore / fsspec: no credentials, no bucket, no network
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise urls.LocationError(f"run directory {self.url} cannot be locked: {text}") from None
        self.held = True
        return self

    def release(self) -> None:
        """Give the lock back (idempotent)."""
        if self.held:
            self._impl.release()
            self.held = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
