"""A stateful stage held by a Dask worker: a Dask actor picked by resources, and its handle.

``DaskExecutor.place(LearnerStage, cfg, run_dir, resources={"GPU": 1})``
starts the stage as a Dask actor (``client.submit(cls, ..., actor=True,
resources=...)``) on a worker that advertises those resources, and returns a
:class:`DaskStageHandle` with the calls the driver uses for any placement::

    handle.call("learn_block", b, target)   # -> StageCall: .done(), .wait(timeout), .result()
    handle.run("checkpoint", loop_json)     # call(...).result()
    handle.publish(version)                 # -> a Dask future of the version's payload
    handle.where()                          # "tcp://10.0.0.7:40123 (host gpu-1, pid 4242)"

Why an actor: the learner's state (TF variables, the replay cache) lives in
one process across the whole run, calls go straight to its worker (no
scheduler hop) and run one at a time in the worker's actor thread, and the
worker's task threads stay free.

Data flows one way: ``publish`` runs a small task *on the learner's
worker* that takes the payload from the actor object there; its result
stays on that worker, and rollout and evaluation tasks that name it fetch
it worker-to-worker. The driver holds the future, never the bytes.

If the learner's worker dies, the actor's state is gone: every later call
raises :class:`LearnerLostError` (one line; the run resumes from its last
checkpoint with ``--resume``). Dask may re-create the actor on another
worker that has the resources; each call names the instance it expects
(:attr:`instance`), so a fresh, untrained stage refuses instead of
silently training on from scratch.
"""
from __future__ import annotations

import json
import os
import pickle
import time
from typing import Any, Dict, Optional

from core.config import ConfigError

#: Seconds to wait for a worker that advertises the learner's resources before giving up.
RESOURCE_WAIT_S = 30.0


class LearnerLostError(ConfigError):
    """The worker that held the learner was lost (one line; resume from the last checkpoint)."""


class Placed:
    """Wraps a stage object on the worker so every call names the instance it expects."""

    def __init__(self, cls, *args: Any, **kwargs: Any):
        self.obj = cls(*args, **kwargs)
        self.instance = os.urandom(8).hex()

    def id(self) -> str:
        return self.instance

    def call(self, instance: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if instance != self.instance:
            raise LearnerLostError("the stage was re-created after its worker was lost (its state is gone)")
        return getattr(self.obj, method)(*args, **kwargs)


def _payload_on_worker(actor_key: str, instance: str, version: int):
    """On the learner's worker: the payload of ``version``, read from the actor object in this process.

    Read directly (not through an actor call), so a payload is handed out at
    once even while the actor thread trains the next block.
    """
    from distributed import get_worker
    placed = get_worker().state.actors[actor_key]
    if placed.instance != instance:
        raise LearnerLostError("the stage was re-created after its worker was lost (its state is gone)")
    return placed.obj.payload(version)


def check_resources(client, resources: Dict[str, float]) -> None:
    """ConfigError (one line) if no worker advertises ``resources`` within RESOURCE_WAIT_S."""
    deadline = time.monotonic() + RESOURCE_WAIT_S
    while True:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        if not resources or any(all(w.get("resources", {}).get(r, 0) >= n for r, n in resources.items())
                                for w in workers.values()):
            return
        if time.monotonic() > deadline:
            seen = ", ".join(f"{a} {json.dumps(w.get('resources', {}))}" for a, w in sorted(workers.items()))
            raise ConfigError(f"learner.resources {json.dumps(resources)}: no worker of the cluster advertises "
                              f"them (workers: {seen or 'none'}); valid: start one with dask worker --resources "
                              f"\"{','.join(f'{r}={n:g}' for r, n in resources.items())}\", or learner.resources {{}}")
        time.sleep(0.5)


class StageCall:
    """One actor method call in flight: ``done``, ``wait(timeout)``, ``result`` (lost worker -> one line)."""

    def __init__(self, handle: "DaskStageHandle", inner):
        self.handle, self.inner = handle, inner

    def done(self) -> bool:
        return self.inner.done() or self.handle.lost()

    def wait(self, timeout: float) -> None:
        try:
            self.inner.result(timeout=timeout)
        except Exception:   # noqa: BLE001 - a timeout or the call's error: result() reports it
            pass

    def result(self) -> Any:
        if not self.inner.done() and self.handle.lost():
            raise self.handle.lost_error("it stopped answering")
        try:
            result = self.inner.result()
        except (OSError, RuntimeError) as e:   # CommClosedError, "Worker holding Actor was lost"
            raise self.handle.lost_error(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
        # What the driver received from the worker (summary driver_bytes_in_per_env_step).
        self.handle.bytes_in += len(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        return result


class DaskStageHandle:
    """The driver's handle on a stage held by a Dask worker (see module docstring)."""

    def __init__(self, client, cls, args, kwargs, resources: Optional[Dict[str, float]], key: str):
        self.client, self.resources, self.key = client, resources or {}, key
        self.bytes_in = 0      # pickled size of every call result the driver received
        check_resources(client, self.resources)
        self.future = client.submit(Placed, cls, *args, actor=True, resources=resources or None, key=key,
                                    pure=False, retries=0, **kwargs)
        self.actor = self.future.result()
        self.instance = self.actor.id().result()
        self.info = self.actor.call(self.instance, "where").result()
        self.address = self.info["address"]

    def lost(self) -> bool:
        return self.future.status != "finished"

    def lost_error(self, why: str) -> LearnerLostError:
        return LearnerLostError(f"the learner's worker {self.address} was lost ({why})")

    def call(self, method: str, *args: Any, **kwargs: Any) -> StageCall:
        if self.lost():
            raise self.lost_error(f"its actor is {self.future.status}")
        return StageCall(self, self.actor.call(self.instance, method, *args, **kwargs))

    def run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.call(method, *args, **kwargs).result()

    def published(self, meta: Dict[str, Any]):
        """What the driver keeps of a published version: its metadata (the bytes stay on the worker)."""
        return PublishedVersion(meta)

    def publish(self, version: int, key: Optional[str] = None):
        """A Dask future of ``version``'s payload, computed on (and kept by) the learner's worker."""
        return self.client.submit(_payload_on_worker, self.future.key, self.instance, version,
                                  key=key or f"{self.key}-payload-v{version}", workers=[self.address],
                                  allow_other_workers=False, pure=False, retries=0)

    def where(self) -> str:
        return f"{self.address} (host {self.info['host']}, pid {self.info['pid']})"

    def close(self) -> None:
        """Close the stage (its checkpoint writes finish) and release the actor."""
        try:
            if not self.lost():
                self.run("close")
        finally:
            self.future.release()


class PublishedVersion:
    """A payload's metadata in the driver (``version``, ``nbytes``, ...) when the bytes stay on a worker."""

    def __init__(self, meta: Dict[str, Any]):
        self.version = int(meta["version"])
        self.nbytes = int(meta["payload_bytes"])
        self.convert_seconds = meta["convert_seconds"]
        self.precision = meta["precision"]
