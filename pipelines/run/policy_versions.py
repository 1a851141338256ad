"""Policy versions of a training run: quantized by the learner stage, published to actors, logged.

:class:`PolicyVersions` is the part of :class:`pipelines.run.driver.Trainer` that asks the learner
stage for versions and hands them to the executor (a mixin, like
:class:`pipelines.run.block_tasks.BlockTasks`)::

    run start            -> _submit_uniform_first_block: block 0 already acts, before the learner
                            exists, when none of its actions reads the policy (below)
                         -> _first_versions: version 1 of the initial network, or (--resume) the
                            checkpoint's versions published again, so the blocks after it act as before
    learner block ends   -> the stage quantized the version the plan asked for (learn_block's publish)
                         -> _on_version: its records to metrics.jsonl, _publish: broadcast, ``broadcast`` record
    central mode         -> _new_version(blocking=False), _poll_async_version: a background quantizer

Block 0 before the learner: a default run's block 0 explores with epsilon = 1, and epsilon-greedy
then draws every action uniformly whatever the Q-values (``rng.random() < 1`` always holds, and the
same random numbers are drawn either way: :func:`core.exploration.epsilon_greedy`). So block 0 acts
with :meth:`~core.quantize.PolicyPayload.uniform`, a stand-in for version 1 with no network, and its
trajectories are bit-identical to version 1's, ``policy_version`` column included. The first env
step then waits for the executor's workers only, not for TensorFlow's import, the learner's build
and the first conversion (together ~2-5 s of a default run's start-up); the driver
(``pipelines/run/driver.py``)::

    early = self._submit_uniform_first_block()     # None unless block 0 acts uniformly (new runs)
    self.stage = self._place_learner()             # TensorFlow, while block 0's actors step
    ...
    f = Flight.begin(self); self._adopt_first_block(f, early)

The stage keeps the parameters of the versions :meth:`_keep_versions` names (the best and those
being evaluated), so the best checkpoint can always be written.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional


def acts_uniformly(selector: str, explore: Dict[str, float]) -> bool:
    """Whether actors with ``selector`` and exploration ``explore`` draw every action uniformly.

    epsilon-greedy at epsilon >= 1: ``rng.random(n) < epsilon`` holds for every row, so the action is
    ``rng.integers(num_actions)`` whatever the Q-values (:func:`core.exploration.epsilon_greedy`).
    """
    return selector == "epsilon_greedy" and float(explore.get("epsilon", 0.0)) >= 1.0


class PolicyVersions:
    """Policy-version steps of ``Trainer`` (a mixin: they share the run's state)."""

    def _submit_uniform_first_block(self):
        """Submit block 0 with a uniform stand-in for version 1 if none of its actions reads the policy.

        Needs ``cfg``, ``spec``, ``builder``, ``plan``, ``loop``, ``run_id``, ``store_url`` and the
        executor, not the learner stage. Returns the Flight of block 0 alone (for
        :meth:`_adopt_first_block`), or None: a resumed run, a block 0 that acts with the policy, a
        learner placed on a worker (placed first, so that actors keep off its worker) or SEED mode
        (its actors stream to the server).
        """
        import dataclasses

        from core.quantize import PolicyPayload
        from pipelines.run import setup as run_setup
        from pipelines.run.flight import Flight
        cfg, plan = self.cfg, self.plan
        if self.resume or self.loop.block or cfg.learner.resources or cfg.inference == "central" or not all(
                acts_uniformly(self.builder.action_selector, self.builder.exploration(cfg.agent, 0, a))
                for a, _ in plan.tasks(0)):
            return None
        self.actor_specs = run_setup.actor_specs(cfg, self.run_id, self.builder.action_selector)
        version = max(self.loop.policy_version, self.asked_version) + 1     # the run's first version
        ref = self.executor.broadcast(PolicyPayload.uniform(version, self.spec.obs_dim,
                                                            self.spec.num_actions))
        now = time.time()
        early = Flight(start=now, plan=dataclasses.replace(plan, num_blocks=1), base_block=0,
                       initial=(ref, version), next_submit=0, next_commit=0, precommitted={}, next_eval=0,
                       last_ckpt_step=0, last_broadcast_step=0, last_progress=now)
        self._submit_blocks(early)
        return early

    @staticmethod
    def _adopt_first_block(f, early) -> None:
        """Take block 0's futures from :meth:`_submit_uniform_first_block`'s flight (None: nothing) into ``f``."""
        if early is None:
            return
        for name in ("rollouts", "rollout_tasks", "writes", "block_ref", "last_task"):
            getattr(f, name).update(getattr(early, name))
        f.next_submit = max(f.next_submit, early.next_submit)

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
