"""core.store_watch: one warning when the store stops answering, one line when it answers again."""
import io
import threading
import time

import tensorstore as ts

from core.store_watch import StoreWatch


class FakeStore:
    """Probes answer at once while ``up``; while down they hang (or fail, with ``refuse``)."""

    def __init__(self):
        self.up, self.refuse, self.probes = True, False, 0
        self._pending = []
        self._lock = threading.Lock()

    def probe(self):
        self.probes += 1
        if self.refuse and not self.up:
            raise ConnectionRefusedError("connection refused")
        promise, future = ts.Promise.new()
        with self._lock:
            if self.up:
                promise.set_result(b"")
            else:
                self._pending.append(promise)
        return future

    def set_up(self, up):
        with self._lock:
            self.up = up
            if up:
                for promise in self._pending:
                    promise.set_result(b"")
                self._pending.clear()


def _watch(store, out):
    return StoreWatch("s3://runs/r", store.probe, every_s=0.05, patience_s=0.2, out=out).start()


def _wait_for(cond, timeout=5.0):
    deadline = time.time() + timeout
    while not cond() and time.time() < deadline:
        time.sleep(0.01)
    assert cond()


def test_a_store_that_answers_prints_nothing():
    store, out = FakeStore(), io.StringIO()
    watch = _watch(store, out)
    _wait_for(lambda: store.probes >= 5)
    watch.stop()
    assert out.getvalue() == "" and watch.outages == 0


def test_an_outage_is_reported_once_and_its_end_with_its_length():
    store, out = FakeStore(), io.StringIO()
    watch = _watch(store, out)
    _wait_for(lambda: store.probes >= 2)
    store.set_up(False)
    _wait_for(lambda: "waiting" in out.getvalue())
    time.sleep(0.6)                          # three more patience periods: still one warning
    probes_while_down = store.probes
    store.set_up(True)
    _wait_for(lambda: "answers again" in out.getvalue())
    watch.stop()
    lines = out.getvalue().splitlines()
    assert lines[0] == ("warning: waiting on the store s3://runs/r: no answer for 0 s; the run retries and goes on "
                        "when it answers")
    assert lines[1].startswith("the store s3://runs/r answers again (no answer for ")
    assert lines[1].endswith(" s); the run goes on") and len(lines) == 2
    assert float(lines[1].split("for ")[1].split(" s")[0]) >= 0.6
    assert probes_while_down - 2 <= 2        # a hanging probe is waited on, not re-sent
    assert watch.outages == 1


def test_a_refusing_store_is_reported_with_its_reason_and_probed_again():
    store, out = FakeStore(), io.StringIO()
    store.refuse = True
    watch = _watch(store, out)
    store.set_up(False)
    _wait_for(lambda: store.probes >= 6)     # re-sent every every_s while refused
    store.set_up(True)
    _wait_for(lambda: "answers again" in out.getvalue())
    watch.stop()
    lines = out.getvalue().splitlines()
    assert lines[0] == ("warning: waiting on the store s3://runs/r: connection refused; the run retries "
                        "and goes on when it answers") and len(lines) == 2
    assert watch.outages == 1
