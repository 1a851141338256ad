"""core.carbon.ledger: one scan of the process table per sample, the same processes as psutil's children()."""
import subprocess
import sys
import time

import psutil

from core.carbon import ledger as ledger_lib
from core.carbon.ledger import Ledger

#: a child that starts a grandchild, then both sleep
TREE = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"


def _spawn_tree():
    proc = subprocess.Popen([sys.executable, "-c", TREE])
    deadline = time.time() + 20
    while len(psutil.Process(proc.pid).children()) < 1 and time.time() < deadline:
        time.sleep(0.05)
    return proc


def _spawn_outside_tree():
    """A process tree that is not this process's (its parent exits at once): as a Dask worker's."""
    out = subprocess.run([sys.executable, "-c", "import subprocess, sys; "
                          f"print(subprocess.Popen([sys.executable, '-c', {TREE!r}], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"],
                         capture_output=True, text=True, check=True)
    worker = psutil.Process(int(out.stdout))
    deadline = time.time() + 20
    while len(worker.children()) < 1 and time.time() < deadline:
        time.sleep(0.05)
    return worker


def test_one_process_table_scan_per_sample_and_the_same_processes(monkeypatch):
    mine, worker = _spawn_tree(), _spawn_outside_tree()
    try:
        assert worker.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
        scans = []
        real = psutil._psplatform.ppid_map
        monkeypatch.setattr(psutil._psplatform, "ppid_map", lambda: scans.append(1) or real())
        ledger = Ledger(lambda: [worker.pid], start_wall=time.time())
        got = {(p.pid, in_tree) for p, in_tree in ledger._candidates()}
        assert len(scans) == 1                           # was 1 + one per worker pid
        me = psutil.Process()
        expected = {(me.pid, True)} | {(p.pid, True) for p in me.children(recursive=True)}
        expected |= {(worker.pid, False)} | {(p.pid, False) for p in psutil.Process(worker.pid).children(recursive=True)}
        assert got == expected
        assert {pid for pid, _ in got} >= {mine.pid, worker.pid} and len(got) >= 5   # children and grandchildren
    finally:
        for proc in (psutil.Process(mine.pid), worker):
            for p in proc.children(recursive=True):
                p.kill()
            proc.kill()
        mine.wait()


def test_without_a_process_table_scan_it_asks_psutil_per_process(monkeypatch):
    monkeypatch.delattr(psutil._psplatform, "ppid_map")
    assert ledger_lib._children_index(psutil) is None
    me = psutil.Process()
    assert {p.pid for p in ledger_lib._descendants(psutil, me.pid, None)} == {p.pid for p in me.children(recursive=True)}


def test_samples_between_scans_reuse_the_process_list(monkeypatch):
    """The process table is scanned every rescan_s (and when asked), not at every sample; a child started
    after a scan is counted once the next scan finds it."""
    scans, pid_calls = [], []
    real = psutil._psplatform.ppid_map
    monkeypatch.setattr(psutil._psplatform, "ppid_map", lambda: scans.append(1) or real())
    ledger = Ledger(lambda: pid_calls.append(1) or [], start_wall=time.time(), rescan_s=3600)
    ledger.sample()
    child = _spawn_tree()
    try:
        ledger.sample()
        ledger.sample()
        assert (len(scans), len(pid_calls)) == (1, 1)
        assert child.pid not in {rec.pid for rec in ledger.procs.values()}
        ledger.sample(rescan=True)
        assert (len(scans), len(pid_calls)) == (2, 2)
        assert child.pid in {rec.pid for rec in ledger.procs.values()}
    finally:
        for p in psutil.Process(child.pid).children(recursive=True):
            p.kill()
        child.kill()
        child.wait()


def test_a_scan_is_due_after_rescan_s(monkeypatch):
    scans = []
    real = psutil._psplatform.ppid_map
    monkeypatch.setattr(psutil._psplatform, "ppid_map", lambda: scans.append(1) or real())
    ledger = Ledger(None, start_wall=time.time(), rescan_s=0.05)
    ledger.sample()
    time.sleep(0.06)
    ledger.sample()
    assert len(scans) == 2
