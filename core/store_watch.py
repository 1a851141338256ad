"""Say so when the run directory's object store stops answering, and when it answers again.

When an object store becomes unreachable (a network partition, the store host
down), every read and write of the run waits while its client retries: the
run stalls with nothing on the screen. A trainer on an object-store run
directory therefore probes the store every ``every_s`` seconds from a daemon
thread (one small read), and when a probe has had no answer for
``patience_s`` seconds it says on stderr, once, that the run waits on the
store; when the store answers again it says after how long::

    warning: waiting on the store s3://runs/r: no answer for 5 s; the run retries and goes on when it answers
    the store s3://runs/r answers again (no answer for 15.4 s); the run goes on

The watch only reports. It changes nothing the run does: the run's own
requests keep their clients' retries (tensorstore's, s3fs's), and a run that
outlives the outage finishes with the same result. ``RunLock`` starts one per
object-store run directory (:mod:`core.run_lock`), beside the lease heartbeat.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Optional, TextIO, Tuple


class StoreWatch:
    """A daemon thread probing a store; see the module docstring.

    Args:
        url: the run directory (for the messages).
        probe: starts one small request and returns its future (``.result(timeout=...)``, raising
            ``TimeoutError`` while it has no answer).
        every_s: seconds between probes while the store answers.
        patience_s: seconds without an answer before the warning.
        out: where the messages go (stderr).
    """

    def __init__(self, url: str, probe: Callable[[], Any], every_s: float = 2.0, patience_s: float = 5.0,
                 out: Optional[TextIO] = None):
        self.url, self.probe, self.every_s, self.patience_s = url, probe, every_s, patience_s
        self.out = out
        self.outages = 0                  # outages reported so far (for tests and the summary)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"store-watch {url}", daemon=True)

    def start(self) -> "StoreWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.every_s + 1.0)

    def _say(self, text: str) -> None:
        print(text, file=self.out or sys.stderr, flush=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._probe_until_answered()

    def _probe_until_answered(self) -> None:
        """One probe; while the store does not answer, wait (and re-probe after an error) until it does."""
        start, warned = time.monotonic(), False
        future, reason = self._start_probe()
        while not self._stop.is_set():
            if future is not None:
                try:
                    future.result(timeout=self.patience_s)
                    break                                   # an answer (also "no such key")
                except TimeoutError:
                    reason = f"no answer for {self.patience_s:.0f} s"
                except Exception as e:  # noqa: BLE001 - refused, reset, DNS: the store is not answering
                    reason, future = _first_line(e), None
            if not warned:
                warned = True
                self.outages += 1
                self._say(f"warning: waiting on the store {self.url}: {reason}; the run retries and goes on "
                          "when it answers")
            if future is None:                              # an error: wait, then ask again
                if self._stop.wait(self.every_s):
                    return
                future, reason = self._start_probe()
        if warned and not self._stop.is_set():
            self._say(f"the store {self.url} answers again (no answer for {time.monotonic() - start:.1f} s); "
                      "the run goes on")

    def _start_probe(self) -> Tuple[Optional[Any], str]:
        """(the probe's future, "") or (None, why it could not be sent)."""
        try:
            return self.probe(), ""
        except Exception as e:  # noqa: BLE001 - reported as an unanswered probe
            return None, _first_line(e)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__
