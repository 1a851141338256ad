"""Per-process CPU seconds of a run on the driver's host (psutil samples), and a worker's own report.

Usage (``core.carbon.EnergyTracker`` runs the ledger on a thread)::

    ledger = Ledger(worker_pids_fn, start_wall=time.time())
    ledger.sample()                       # at start, every sample_interval_s and at stop
    for proc, cpu_s in ledger.counted():  # after the gone-process rule below
        ...
    process_cpu_report()                  # inside a worker: kwargs for add_process_cpu_seconds

What the ledger counts: every sample covers the driver (learner) process,
all its descendants, and every PID returned by ``worker_pids_fn`` plus their
descendants. A process's CPU time is
``user + system + children_user + children_system`` minus its value at start
(zero baseline for processes created during the run). ``children_*`` counts
descendants the process has already reaped, so a Dask ``LocalCluster`` closed
before ``stop()`` is still counted, through the driver. A process that has
gone is skipped when a tracked ancestor is still alive (its time is in that
ancestor's ``children_*``); otherwise its last sample counts (a lower bound:
at most ``sample_interval_s`` of its CPU time is lost). Without psutil only
the driver and its reaped children are counted (``os.times``).

Which processes to sample is found by a scan of the process table (and a
``worker_pids_fn`` call) every ``rescan_s`` (10 s), at the first sample and
at ``sample(rescan=True)`` (the tracker's last); the samples between read the
CPU times of the processes already found. A process started and reaped
between two scans is not lost: its time is in its tracked parent's
``children_*``. The scan was most of an idle driver's CPU: 2.5 ms per sample
for ~75 processes (a 2-core AMD EPYC, 2026-12-06), growing with every process
on the host, where reading a known process's times costs ~0.1 ms.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from core import stage_cpu


@dataclasses.dataclass
class _Proc:
    label: str
    pid: int
    ppid: int
    in_tree: bool
    base: float
    last: float
    own_base: float
    own_last: float
    alive: bool = True


def _cpu_total(p) -> Tuple[float, float]:
    """(user+system, user+system+children_user+children_system) of a psutil.Process."""
    t = p.cpu_times()
    own = t.user + t.system
    return own, own + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)


def _children_index(ps) -> Optional[Dict[int, List[int]]]:
    """ppid -> child pids, from one scan of the process table (None: this psutil cannot give it).

    ``psutil.Process.children`` scans every process's ``/proc/<pid>/stat`` on each call; a sample
    asked it once for the driver and once per worker, 1.5 ms of CPU each on this machine, so the
    ledger was most of an idle driver's CPU (cluster_scale with 8 worker processes, 2026-12-05).
    """
    ppid_map = getattr(getattr(ps, "_psplatform", None), "ppid_map", None)
    if ppid_map is None:
        return None
    try:
        index: Dict[int, List[int]] = {}
        for pid, ppid in ppid_map().items():
            index.setdefault(ppid, []).append(pid)
        return index
    except Exception:  # noqa: BLE001 - fall back to psutil's own scan per process
        return None


def _descendants(ps, pid: int, children: Optional[Dict[int, List[int]]]) -> list:
    """psutil.Process objects of every descendant of ``pid`` (``children(recursive=True)``'s set)."""
    if children is None:
        try:
            return ps.Process(pid).children(recursive=True)
        except (ps.NoSuchProcess, ps.AccessDenied):
            return []
    out, stack, seen = [], list(children.get(pid, ())), {pid}
    while stack:
        child = stack.pop()
        if child in seen:
            continue
        seen.add(child)
        try:
            out.append(ps.Process(child))
        except (ps.NoSuchProcess, ps.AccessDenied):
            continue
        stack.extend(children.get(child, ()))
    return out


class Ledger:
    """Per-process CPU seconds of the driver tree and worker PIDs (see module docstring)."""

    def __init__(self, worker_pids_fn: Optional[Callable[[], Iterable[int]]], start_wall: float,
                 rescan_s: float = 10.0):
        self._fn = worker_pids_fn
        self._start_wall = start_wall
        self._rescan_s = float(rescan_s)
        self._found: List[Tuple[object, bool]] = []     # (psutil.Process, in_tree) of the last scan
        self._scanned_at = -float("inf")
        self.procs: Dict[Tuple[int, float], _Proc] = {}
        self.notes: List[str] = []
        self.rss_samples: List[float] = []
        try:
            import psutil
            self._ps = psutil
            self._root = psutil.Process()
        except ImportError:
            self._ps = None
            self._t0 = os.times()
            self.notes.append("psutil missing: only the driver and its reaped children are counted")

    def _candidates(self):
        ps, seen = self._ps, set()
        children = _children_index(ps)          # one scan of the process table per sample
        for p in [self._root, *_descendants(ps, self._root.pid, children)]:
            seen.add(p.pid)
            yield p, True
        if self._fn is None:
            return
        try:
            pids = [int(x) for x in self._fn()]
        except Exception as e:  # a failing callback must not end the run
            msg = f"worker_pids_fn failed: {type(e).__name__}: {e}"
            if msg not in self.notes:
                self.notes.append(msg)
            return
        for pid in pids:
            try:
                w = ps.Process(pid)
                for p in [w, *_descendants(ps, pid, children)]:
                    if p.pid not in seen:
                        seen.add(p.pid)
                        yield p, False
            except (ps.NoSuchProcess, ps.AccessDenied):
                continue

    def _processes(self, rescan: bool) -> List[Tuple[object, bool]]:
        """The processes to sample: a fresh scan every ``rescan_s`` (or when asked), else the last scan's."""
        now = time.monotonic()
        if rescan or now - self._scanned_at >= self._rescan_s:
            self._found, self._scanned_at = list(self._candidates()), now
        return self._found

    def sample(self, rescan: bool = False) -> None:
        """Read the CPU times of the run's processes (``rescan``: scan the process table first)."""
        if self._ps is None:
            return
        ps, rss = self._ps, 0.0
        for proc in self.procs.values():
            proc.alive = False
        for p, in_tree in self._processes(rescan):
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    own, total = _cpu_total(p)
                    rss += p.memory_info().rss
                    ppid, name = p.ppid(), p.name()
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
                continue
            rec = self.procs.get(key)
            if rec is None:
                new = key[1] >= self._start_wall - 0.05  # created during the run: all its time counts
                label = ("driver" if p.pid == self._root.pid else name) + f" pid={p.pid}"
                rec = self.procs[key] = _Proc(label, p.pid, ppid, in_tree,
                                              0.0 if new else total, total,
                                              0.0 if new else own, own)
            rec.last, rec.own_last, rec.alive = total, own, True
        self.rss_samples.append(rss / 2**30)

    def counted(self) -> List[Tuple[_Proc, float]]:
        """(process, CPU seconds it adds) after the gone-process rule."""
        if self._ps is None:
            t = os.times()
            s = sum(t[:4]) - sum(self._t0[:4])
            return [(_Proc(f"driver pid={os.getpid()}", os.getpid(), 0, True, 0, s, 0, s), s)]
        by_pid = {p.pid: p for p in self.procs.values()}
        out = []
        for rec in self.procs.values():
            if not rec.alive and self._covered_by_ancestor(rec, by_pid):
                continue
            out.append((rec, max(0.0, rec.last - rec.base)))
        return out

    @staticmethod
    def _covered_by_ancestor(rec: _Proc, by_pid: Dict[int, _Proc]) -> bool:
        """True when a tracked ancestor accounts for ``rec``: a live one through its
        ``children_*`` counters, else the topmost gone one through its last sample."""
        parent, hops = by_pid.get(rec.ppid), 0
        while parent is not None and hops < 64:
            if parent.alive:
                return True
            parent, hops = by_pid.get(parent.ppid), hops + 1
        return rec.ppid in by_pid

    def mean_rss_gb(self) -> float:
        return sum(self.rss_samples) / len(self.rss_samples) if self.rss_samples else 0.0


def process_cpu_seconds() -> float:
    """This process's CPU seconds: user + system, own and reaped children's (``getrusage``)."""
    return stage_cpu.process_cpu_seconds()


def process_cpu_report(label: Optional[str] = None) -> dict:
    """Run *inside a worker*: its CPU seconds (own + reaped children) as kwargs for
    ``EnergyTracker.add_process_cpu_seconds``. Host and pid let the driver avoid double counting."""
    host, pid = socket.gethostname(), os.getpid()
    return {"label": label or f"worker {host} pid={pid}", "seconds": process_cpu_seconds(),
            "host": host, "pid": pid}
