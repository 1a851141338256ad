"""CPU seconds of every process that ran a stage of a run, recorded where the stage ran.

The energy ledger (:mod:`core.carbon`) samples processes on the driver's host.
A Dask worker on another host, or a Beam/Dataflow worker, is out of its
reach, so each stage records its own process's CPU time and leaves it in the
run directory, where the driver reads it at the end::

    sink = sink_url(run_dir, session)                  # EnergyTracker.stage_cpu_sink
    task = CountStageCpu(run_rollout_task, sink)       # what an executor submits instead
    task(*args)                                        # same result; records this process's CPU
    records = read_records(sink)                       # driver, at stop: one ProcessCpu per process

Accounting. A process's CPU clock ``c`` is ``user + system`` of the process and of
its reaped children (``getrusage``): monotonic, and it includes helper
processes the stage reaped. Stage ``k`` in that process spans
``[c_start_k, c_end_k]`` on this clock, and the process's counted CPU is the
length of the union of its spans::

    covered = | U_k [c_start_k, c_end_k] |

so stages that overlap in one process (``threads_per_worker > 1``) are counted
once, and CPU the process spends between stages (other runs' tasks on a
shared cluster, idle heartbeats) is not. Because a span is recorded when its
stage ends, and ``c`` is monotonic, each new span's end is the largest so far:
it can only merge with a suffix of the (sorted, disjoint) union, which keeps
recording O(1) amortized.

``by_stage`` sums each stage function's span lengths (overlapping stages
double count there: a breakdown, not the counted figure).

Storage: after every stage the process rewrites its own JSON record,
``sink/<host>-<pid>-<start ms>.json`` (a temp name and a rename on local
disk; one put on object stores), so a killed worker's record still covers
every stage that finished, and a retried task only adds the CPU it really
used. The file name includes the process start time, so a reused pid never
overwrites another process's record. Records from workers that cannot reach
the run directory (``memory://`` in another process) are simply absent.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from core import urls

SCHEMA_VERSION = 1
SINK_DIR = "carbon"


def process_cpu_seconds() -> float:
    """This process's CPU seconds so far: own user+system plus reaped children's.

    ``getrusage`` (microseconds) rather than ``os.times`` (10 ms clock ticks,
    as long as a short rollout task); ``os.times`` where there is no ``resource``.
    """
    try:
        import resource
    except ImportError:   # Windows
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def sink_url(run_dir: str, session: str) -> str:
    """Where one tracking session's stage records go: ``run_dir/carbon/<session>``."""
    return urls.join(run_dir, SINK_DIR, session)


def new_session() -> str:
    """A session id, unique per EnergyTracker start (so ``--resume`` never re-reads old records)."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


@dataclasses.dataclass
class ProcessCpu:
    """One process's stage CPU for one session (what its JSON record holds)."""
    host: str
    pid: int
    started: float                 # process start, unix seconds (first stage if unknown)
    covered_s: float = 0.0         # |union of stage spans| on the process CPU clock
    stages: int = 0
    by_stage: Dict[str, float] = dataclasses.field(default_factory=dict)
    spans: List[List[float]] = dataclasses.field(default_factory=list)   # the union, sorted, disjoint
    schema_version: int = SCHEMA_VERSION

    def add(self, name: str, c0: float, c1: float) -> None:
        """Record a finished stage spanning ``[c0, c1]``; ``c1`` must be the largest end so far."""
        self.stages += 1
        self.by_stage[name] = self.by_stage.get(name, 0.0) + (c1 - c0)
        lo = c0
        while self.spans and self.spans[-1][1] >= c0:   # merges with a suffix of the union
            s, e = self.spans.pop()
            self.covered_s -= e - s
            lo = min(lo, s)
        self.spans.append([lo, c1])
        self.covered_s += c1 - lo

    @property
    def label(self) -> str:
        return f"stages {self.host} pid={self.pid}"

    def record_name(self) -> str:
        return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', self.host)}-{self.pid}-{int(self.started * 1000)}.json"


_LOCK = threading.Lock()
_RECORDS: Dict[str, ProcessCpu] = {}   # sink -> this process's record


def _process_started() -> float:
    try:
        import psutil
        return psutil.Process().create_time()
    except Exception:  # psutil is optional here; the first stage's time still keys the record
        return time.time()


def _record_for(sink: str) -> ProcessCpu:
    rec = _RECORDS.get(sink)
    if rec is None or rec.pid != os.getpid():   # a forked child starts its own record
        rec = _RECORDS[sink] = ProcessCpu(socket.gethostname(), os.getpid(), _process_started())
    return rec


def _save(sink: str, rec: ProcessCpu) -> None:
    fs, path = urls.resolve(urls.join(sink, rec.record_name()))
    data = json.dumps(dataclasses.asdict(rec), sort_keys=True)
    if type(fs).__name__ != "LocalFileSystem":
        fs.pipe_file(path, data.encode())
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w") as f:   # no fsync: an advisory record, rewritten after every stage
        f.write(data)
    os.replace(tmp, path)


def record_stage(sink: str, name: str, c0: float, c1: Optional[float] = None) -> None:
    """Add a stage that began at CPU clock ``c0`` (and ends now, or at ``c1``) and save the record."""
    with _LOCK:
        end = process_cpu_seconds() if c1 is None else c1
        rec = _record_for(sink)
        rec.add(name, c0, end)
        _save(sink, rec)


@dataclasses.dataclass(frozen=True)
class CountStageCpu:
    """``fn`` with its process CPU recorded under ``sink``; results and exceptions pass through.

    Picklable when ``fn`` is (Dask, Beam). An empty ``sink`` records nothing.
    A failure to save the record is swallowed: accounting never fails a stage.
    """
    fn: Callable[..., Any]
    sink: str

    def __call__(self, *args, **kwargs):   # unannotated: Beam would type-check its *args/**kwargs
        c0 = process_cpu_seconds()
        try:
            return self.fn(*args, **kwargs)
        finally:
            if self.sink:
                try:
                    record_stage(self.sink, getattr(self.fn, "__name__", type(self.fn).__name__), c0)
                except Exception:  # noqa: BLE001 (a full disk must not fail a rollout)
                    pass

    @property
    def __name__(self) -> str:   # Dask names tasks after the function
        return getattr(self.fn, "__name__", "stage")


def counted(fn: Callable[..., Any], sink: Optional[str]) -> Callable[..., Any]:
    """``CountStageCpu(fn, sink)``, or ``fn`` itself when ``sink`` is empty (tracking off)."""
    return CountStageCpu(fn, sink) if sink else fn


def read_records(sink: str) -> Tuple[List[ProcessCpu], List[str]]:
    """Every process record under ``sink`` and notes on any that could not be read."""
    fs, path = urls.resolve(sink)
    try:
        names = [n for n in fs.ls(path, detail=False) if n.endswith(".json")]
    except FileNotFoundError:
        return [], []
    out, notes = [], []
    for name in sorted(names):
        try:
            with fs.open(name, "r") as f:
                d = json.load(f)
            if d.get("schema_version", 0) > SCHEMA_VERSION:
                raise ValueError(f"schema_version {d.get('schema_version')} > {SCHEMA_VERSION}")
            fields = {f.name for f in dataclasses.fields(ProcessCpu)}
            out.append(ProcessCpu(**{k: v for k, v in d.items() if k in fields}))
        except Exception as e:  # one bad record must not lose the others
            notes.append(f"stage record {os.path.basename(name)} unreadable ({type(e).__name__}: {e})")
    return out, notes
