"""DynamicBatcher: rows from many streams -> one policy call, bounded by size AND time.

A batch closes when it holds ``max_batch_size`` rows or when its wait has
passed since its *first* request arrived, whichever comes first, so a
partial batch never waits forever (it also closes early once it holds one
request per connected client, if ``expected_requests`` says how many) (the
original SEED batcher had no timeout and stalled with fewer actors than its
batch size). A request larger than ``max_batch_size`` runs as its own batch.
Requests carry a *key* (the server's: the policy version of the request's
task); a batch runs one call per key, so rows of two versions can share a
batch's wait but never a policy call.

**The wait is tuned to the measured arrival rate** (``adaptive=True``; the
server's ``adaptive_wait``). Merging the next request into an open batch
saves at most one policy call; waiting for it costs every row already in
the batch the time until it arrives. So a batch waits only while requests
arrive faster than a call takes, and then no longer than one call::

    wait = min(max_wait_s, call_s)   if gap_s < call_s
           0                          otherwise           (run what is queued now)

with ``gap_s`` the mean time between consecutive requests and ``call_s`` the
mean policy call, both exponential moving averages (weight 1/8) of what the
batcher measures (:func:`adaptive_wait`). Until one gap has been seen, the
wait is ``max_wait_s``. With 2 actors x 16 envs on this 2-core machine the
gaps (0.5-7 ms) dwarf the calls (0.02 ms MLP, 0.86 ms Nature CNN int8), so a
request runs at once and the server's inference overlaps the other actor's
env stepping, instead of a fixed wait holding both actors in lock step;
with many actors or a costly call (an accelerator's launch and copy)
batches fill again.

One call of the policy runs at a time (a lock; a LiteRT interpreter is not
re-entrant), normally on the batcher's own thread while the submitting
threads decode and assemble around it. **Caller runs**: when the wait is 0
(adaptive, slow arrivals), nothing is queued and no call is running, the
thread that submits a request runs it, under the same lock. That is two
thread hand-offs fewer per request (batched inference of an MLP request:
0.36-0.52 ms -> 0.04 ms wall on the loaded machine) with the same overlap,
since LiteRT releases the GIL while it runs.

Example::

    batcher = DynamicBatcher(policy, max_batch_size=64, max_wait_s=0.002, adaptive=True)
    logits = batcher.submit(obs_rows).result()     # from any thread
    batcher.stats()   # {"batches", "rows", "mean_fill", "latency_ms_p50", "wait_ms", "gap_ms", ...}
    batcher.close()
"""
from __future__ import annotations

import collections
import concurrent.futures
import queue
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import numpy as np


#: weight of the newest sample in the moving averages of gaps and call times
EWMA_WEIGHT = 1.0 / 8


def adaptive_wait(gap_s: Optional[float], call_s: Optional[float], max_wait_s: float) -> float:
    """How long an open batch waits for more requests (module docstring); exact, no clock.

    >>> adaptive_wait(None, None, 0.002), adaptive_wait(0.0003, 0.001, 0.002), adaptive_wait(0.003, 0.0006, 0.002)
    (0.002, 0.001, 0.0)
    """
    if gap_s is None or call_s is None:
        return max_wait_s
    return min(max_wait_s, call_s) if gap_s < call_s else 0.0


def _ewma(old: Optional[float], new: float) -> float:
    return new if old is None else old + EWMA_WEIGHT * (new - old)


class DynamicBatcher:
    """Batches ``submit(rows)`` calls into ``fn(concatenated rows)`` calls (see module docstring)."""

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray], max_batch_size: int = 64,
                 max_wait_s: float = 0.002, latency_window: int = 10_000,
                 expected_requests: Optional[Callable[[], int]] = None, adaptive: bool = False):
        if max_batch_size < 1 or max_wait_s < 0:
            raise ValueError(f"max_batch_size={max_batch_size}, max_wait_s={max_wait_s}; "
                             f"valid: max_batch_size >= 1, max_wait_s >= 0")
        self.fn = fn
        # Optional early close: once as many requests as there are clients are in
        # the batch, nobody else can add to it, so waiting longer only adds latency.
        self.expected_requests = expected_requests
        self.max_batch_size = int(max_batch_size)
        self.max_wait_s = float(max_wait_s)
        self.adaptive = bool(adaptive)
        self.gap_s: Optional[float] = None         # mean time between consecutive requests (adaptive)
        self.call_s: Optional[float] = None        # mean policy call
        self._last_arrival: Optional[float] = None
        self._queue: "queue.Queue[Tuple[np.ndarray, concurrent.futures.Future, float, Any]]" = queue.Queue()
        self._closed = threading.Event()
        self._carry = None
        self.batches = 0
        self.rows = 0
        self.requests = 0
        self.timeouts = 0                      # batches closed by max_wait_s
        self.queued_s = 0.0                    # sum over requests: submit -> their batch starts running
        self.infer_s = 0.0                     # sum over batches: the policy call
        self.infer_cpu_s = 0.0                 # the same in this thread's CPU time (wall minus preemption)
        self._latency: Deque[float] = collections.deque(maxlen=latency_window)
        self._fill: Deque[float] = collections.deque(maxlen=latency_window)
        self.inline = 0                        # requests run by the submitting thread (caller runs)
        self._run_lock = threading.Lock()      # one policy call at a time
        self._thread = threading.Thread(target=self._loop, name="inference-batcher", daemon=True)
        self._thread.start()

    def submit(self, rows: np.ndarray, key: Any = None) -> concurrent.futures.Future:
        """Queue ``rows`` ``[n, ...]``; the future resolves to ``fn``'s output rows for them.

        ``key``: rows of one batch with different keys run in separate calls ``fn(rows, key)``
        (the server's key is the policy version a task acts with); None calls ``fn(rows)``.
        """
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self._closed.is_set():
            fut.set_exception(RuntimeError("the batcher is closed"))
            return fut
        now = time.perf_counter()
        last, self._last_arrival = self._last_arrival, now      # racy across threads: only a statistic
        if last is not None:
            self.gap_s = _ewma(self.gap_s, now - last)
        if (self.adaptive and self._carry is None and self._queue.empty() and self.wait_s() == 0.0
                and self._run_lock.acquire(blocking=False)):
            try:                          # caller runs (module docstring)
                self.inline += 1
                self._run([(rows, fut, now, key)], timed_out=False)
            finally:
                self._run_lock.release()
            return fut
        self._queue.put((rows, fut, now, key))
        return fut

    def wait_s(self) -> float:
        """The wait of the next batch (``max_wait_s``, or :func:`adaptive_wait` of the measured rates)."""
        return adaptive_wait(self.gap_s, self.call_s, self.max_wait_s) if self.adaptive else self.max_wait_s

    def _collect(self) -> Tuple[List[Tuple[np.ndarray, concurrent.futures.Future, float, Any]], bool]:
        """Block for the first request, then gather more until full or the deadline passes."""
        first = self._carry
        self._carry = None
        while first is None:
            try:
                first = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._closed.is_set():
                    return [], False
        items, n = [first], len(first[0])
        deadline = first[2] + self.wait_s()
        expected = self.expected_requests() if self.expected_requests else 0
        while n < self.max_batch_size and not (expected and len(items) >= expected):
            remaining = deadline - time.perf_counter()
            try:
                item = self._queue.get_nowait() if remaining <= 0 else self._queue.get(timeout=remaining)
            except queue.Empty:
                return items, True
            if n + len(item[0]) > self.max_batch_size:
                self._carry = item       # does not fit: first of the next batch
                return items, False
            items.append(item)
            n += len(item[0])
        return items, False

    def _loop(self) -> None:
        while True:
            items, timed_out = self._collect()
            if not items:
                return
            with self._run_lock:
                self._run(items, timed_out)

    def _run(self, items, timed_out: bool) -> None:
        """Policy calls for ``items``, one per key (the caller holds the run lock); resolves their futures."""
        groups: Dict[Any, List[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(item[3], []).append(i)
        started, cpu0 = time.perf_counter(), time.thread_time()
        for key, idx in groups.items():
            rows = [items[i][0] for i in idx]
            x = rows[0] if len(rows) == 1 else np.concatenate(rows)
            try:
                out = self.fn(x) if key is None else self.fn(x, key)
            except Exception as e:  # a policy failure fails these requests, not the server
                for i in idx:
                    items[i][1].set_exception(e)
                continue
            start = 0
            for i in idx:
                n = len(items[i][0])
                items[i][1].set_result(out[start:start + n])
                start += n
        done = time.perf_counter()
        self.call_s = _ewma(self.call_s, done - started)
        self.infer_cpu_s += time.thread_time() - cpu0
        n = sum(len(it[0]) for it in items)
        self._latency.extend(done - it[2] for it in items)
        self.queued_s += sum(started - it[2] for it in items)
        self.infer_s += done - started
        self.batches += 1
        self.requests += len(items)
        self.rows += n
        self.timeouts += int(timed_out)
        self._fill.append(min(1.0, n / self.max_batch_size))

    def stats(self) -> Dict[str, float]:
        """Batches, rows, mean batch fill, request latency percentiles (ms), mean queueing and policy time."""
        lat = np.asarray(self._latency, np.float64) * 1e3
        pct = np.percentile(lat, [50, 90, 99]) if len(lat) else [float("nan")] * 3
        return {"batches": self.batches, "requests": self.requests, "rows": self.rows,
                "timeouts": self.timeouts, "inline": self.inline,
                "mean_fill": float(np.mean(self._fill)) if self._fill else 0.0,
                "latency_ms_p50": float(pct[0]), "latency_ms_p90": float(pct[1]), "latency_ms_p99": float(pct[2]),
                "queued_ms_mean": 1e3 * self.queued_s / max(self.requests, 1),
                "infer_ms_per_batch": 1e3 * self.infer_s / max(self.batches, 1),
                "infer_cpu_ms_per_batch": 1e3 * self.infer_cpu_s / max(self.batches, 1),
                "wait_ms": 1e3 * self.wait_s(), "gap_ms": 1e3 * self.gap_s if self.gap_s is not None else None,
                "call_ms": 1e3 * self.call_s if self.call_s is not None else None}

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        while True:   # fail whatever is still queued
            try:
                _, fut, _, _ = self._queue.get_nowait()
            except queue.Empty:
                break
            if not fut.done():
                fut.set_exception(RuntimeError("the batcher is closed"))
