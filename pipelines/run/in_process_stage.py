"""The learner stage in the driver's process: the handle calls every placement offers, answered here.

:class:`InProcessStage` wraps a stage object (:class:`~pipelines.run.learner_stage.LearnerStage`)
placed in this process, the default (``learner.resources: {}``); the Dask handle
(:class:`pipelines.executors.dask_stage.DaskStageHandle`) offers the same calls for a stage a worker
holds, so the driver steers either the same way::

    stage = InProcessStage(LearnerStage(cfg, run_dir), executor)
    fut = stage.call("learn_block", b, target, publish, keep)   # a done future, as local submit returns
    out = stage.run("new_version", 2, [], True)                 # the result itself
    ref = stage.publish(2)                                      # the executor's broadcast of the payload

:class:`InProcessParts` lets central mode (:mod:`pipelines.run.central`) reach the in-process
stage's learner, sampler and quantizers directly.
"""
from __future__ import annotations

import concurrent.futures
import os
import socket
from typing import Any, Dict, Optional


class InProcessParts:
    """The parts of an in-process stage, which central mode (pipelines/run/central.py) drives directly.

    A mixin of :class:`pipelines.run.driver.Trainer`; ``self.stage`` is an :class:`InProcessStage`.
    """
    learner = property(lambda self: self.stage.obj.learner)
    sampler = property(lambda self: self.stage.obj.sampler)
    cache = property(lambda self: self.stage.obj.cache)
    ckpt = property(lambda self: self.stage.obj.ckpt)
    rng = property(lambda self: self.stage.obj.rng)
    quantizer = property(lambda self: self.stage.obj.quantizer,
                         lambda self, q: setattr(self.stage.obj, "quantizer", q))
    async_quantizer = property(lambda self: self.stage.obj.async_quantizer,
                               lambda self, q: setattr(self.stage.obj, "async_quantizer", q))


class InProcessStage:
    """A stage object in this process, behind the handle calls every placement offers.

    ``call`` runs the method at once and returns a done future (like the
    local executor's submit); ``publish`` hands a version's payload to the
    executor's ``broadcast``. The Dask handle (``DaskExecutor.place``) offers
    the same calls for a stage held by a worker.
    """

    def __init__(self, obj, executor):
        self.obj, self.executor = obj, executor

    def call(self, method: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(getattr(self.obj, method)(*args, **kwargs))
        except Exception as e:  # surfaced by .result(), like a remote failure
            future.set_exception(e)
        return future

    def run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.obj, method)(*args, **kwargs)

    address = None     # no worker holds it
    bytes_in = 0       # nothing crosses a process boundary

    def published(self, meta: Dict[str, Any]):
        """The published version's payload itself (central mode swaps it into its inference server)."""
        return self.obj.payload(meta["version"])

    def publish(self, version: int, key: Optional[str] = None) -> Any:
        return self.executor.broadcast(self.obj.payload(version))

    def where(self) -> str:
        return f"{socket.gethostname()} pid {os.getpid()} (driver process)"

    def close(self) -> None:
        self.obj.close()
