"""Separate hosts on one Linux machine: network namespaces on a private bridge (test support).

Each *host* is a network namespace with its own loopback and one address on a
bridge that lives in a namespace of its own (the *switch*), so nothing is added
to the machine's own network, and deleting the namespaces removes every link::

    with Hosts(["store", "scheduler", "w0"]) as hosts:
        proc = hosts.start("store", [sys.executable, "-m", "moto.server", "-H", hosts.ip("store")], log)
        hosts.link("store", up=False)      # the store host's cable pulled
        hosts.kill("w0")                   # every process of that host, SIGKILL

Processes run with ``ip netns exec``: the same file system and user, but only
the network that host has. ``Hosts`` needs root (network namespaces); without
it, :func:`require_root` fails with one line naming why.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional, Sequence


def require_root() -> Optional[str]:
    """None if this process can make network namespaces, else the one-line reason it cannot."""
    if shutil.which("ip") is None:
        return "the multi-host test needs iproute2's `ip` command (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "the multi-host test needs root to create network namespaces (ip netns); run it as root"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    """Namespaces ``<prefix>-<name>`` on subnet ``10.<a>.<b>.0/24``, torn down by :meth:`close`."""

    def __init__(self, names: Sequence[str]):
        rnd = random.Random(os.getpid() ^ time.time_ns())
        self.prefix = f"db{rnd.randrange(16 ** 4):04x}"
        self.subnet = f"10.{rnd.randrange(200, 250)}.{rnd.randrange(1, 250)}"
        self.names = list(names)
        self.switch = f"{self.prefix}-sw"
        self.procs: List[subprocess.Popen] = []
        self._made: List[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            ns = self.ns(name)
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            # the host's end is eth0 in its namespace; the switch's end is port<i> on the bridge
            _ip("link", "add", f"{self.prefix}h{i}", "type", "veth", "peer", "name", f"{self.prefix}p{i}")
            _ip("link", "set", f"{self.prefix}h{i}", "netns", ns, "name", "eth0")
            _ip("link", "set", f"{self.prefix}p{i}", "netns", self.switch, "name", f"port{i}")
            _ip("-n", ns, "addr", "add", f"{self.ip(name)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", self.switch, "link", "set", f"port{i}", "master", "br0")
            _ip("-n", self.switch, "link", "set", f"port{i}", "up")

    def ns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def ip(self, name: str) -> str:
        return f"{self.subnet}.{self.names.index(name) + 1}"

    def start(self, name: str, cmd: Sequence[str], log_path, env: Dict[str, str], cwd: Optional[str] = None,
              **popen) -> subprocess.Popen:
        """``cmd`` on host ``name``, its output appended to ``log_path`` (unless ``popen`` redirects it)."""
        out = popen.pop("stdout", None)
        log = open(log_path, "a") if out is None else None
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(name), *cmd], env=env, cwd=cwd,
                                stdout=log if out is None else out,
                                stderr=subprocess.STDOUT if out is None else popen.pop("stderr", None),
                                start_new_session=True, **popen)
        if log is not None:
            log.close()     # the child holds its own descriptor
        self.procs.append(proc)
        return proc

    def pids(self, name: str) -> List[int]:
        out = subprocess.run(["ip", "netns", "pids", self.ns(name)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def kill(self, name: str) -> List[int]:
        """SIGKILL every process of host ``name`` (as if the machine lost power); their pids."""
        pids = self.pids(name)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def link(self, name: str, up: bool) -> None:
        """Connect or disconnect host ``name`` from the bridge (its processes keep running)."""
        _ip("-n", self.switch, "link", "set", f"port{self.names.index(name)}", "up" if up else "down")

    def close(self) -> None:
        """Kill every process of every host, then delete the namespaces (and with them every link)."""
        for ns in self._made:
            out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in map(int, out.stdout.split()):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
