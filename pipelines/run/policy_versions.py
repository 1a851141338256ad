"""Policy versions of a training run: quantized by the learner stage, published to actors, logged.

:class:`PolicyVersions` is the part of :class:`pipelines.run.driver.Trainer` that asks the learner
stage for versions and hands them to the executor (a mixin, like
:class:`pipelines.run.block_tasks.BlockTasks`)::

    run start            -> _first_versions: version 1 of the initial network, or (--resume) the
                            checkpoint's versions published again, so the blocks after it act as before
    learner block ends   -> the stage quantized the version the plan asked for (learn_block's publish)
                         -> _on_version: its records to metrics.jsonl, _publish: broadcast, ``broadcast`` record
    central mode         -> _new_version(blocking=False), _poll_async_version: a background quantizer

The stage keeps the parameters of the versions :meth:`_keep_versions` names (the best and those
being evaluated), so the best checkpoint can always be written.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List


class PolicyVersions:
    """Policy-version steps of ``Trainer`` (a mixin: they share the run's state)."""

    def _next_version(self) -> int:
        self.asked_version = max(self.loop.policy_version, self.asked_version) + 1
        return self.asked_version

    def _keep_versions(self) -> List[int]:
        """Versions whose parameters the stage keeps: the best and those being evaluated."""
        return [self.loop.best_version, *sorted(self.eval_versions)]

    def _first_versions(self) -> None:
        """Publish the run's first version; a resumed run republishes the checkpoint's versions instead.

        The blocks after a checkpoint act with versions made before it
        (policy lag, broadcast_period): the checkpoint carries their payloads,
        so they act exactly as in the uninterrupted run. A checkpoint from
        before it did (no versions) gets a new version of its parameters.
        """
        if not self.restored_versions:
            self._new_version(blocking=True)
            return
        metas = {m["version"]: m for m in self.restored_versions}
        refs = {v: self.stage.publish(v, key=f"payload-{self.run_id}-v{v}") for v in sorted(metas)}
        newest = self.loop.policy_version if self.loop.policy_version in metas else max(metas)
        self.payload, self.payload_ref = self.stage.published(metas[newest]), refs[newest]
        for v in refs:
            self.version_time[v] = time.time()
        self.restored_refs = {int(pb): (refs[v], v) for pb, v in self.loop.versions.items()}
        self.restored_eval_refs = refs

    def _new_version(self, blocking: bool) -> None:
        """Quantize the learner's policy as the next version and broadcast it (stage.new_version)."""
        self._on_version(self.stage.run("new_version", self._next_version(), self._keep_versions(), blocking))

    def _poll_async_version(self) -> None:
        if self.stage.address is None and self.async_quantizer is not None:
            self._on_version(self.stage.run("poll_version"))

    def _on_version(self, out: Dict[str, Any]) -> None:
        """Write a stage call's records; publish the version it made, if any."""
        self._write_records(out["records"])
        if out.get("published") is not None:
            self._publish(self.stage.published(out["published"]))

    def _publish(self, payload) -> None:
        """Send ``payload`` (or, for a stage on a worker, its metadata) to actors and log it."""
        self.payload = payload
        self.payload_ref = self.stage.publish(payload.version, key=f"payload-{self.run_id}-v{payload.version}")
        self.loop.policy_version = payload.version
        self.version_time[payload.version] = time.time()
        self.log.write("broadcast", step=self.learner_steps, version=payload.version,
                       payload_bytes=payload.nbytes, convert_seconds=payload.convert_seconds,
                       precision=payload.precision)

    def _write_records(self, records) -> None:
        for kind, step, fields in records:
            self.log.write(kind, step=step, **fields)
