"""The learner as a stage an executor places: learner, replay cache, sampler, versions, checkpoints.

One :class:`LearnerStage` object holds everything that needs the learner's
TensorFlow state, so the executor can put it where the accelerator is: in
the driver process (``learner.resources: {}``, every executor;
:mod:`pipelines.run.in_process_stage`), or as a
long-lived Dask actor on the worker that advertises ``learner.resources``
(:meth:`pipelines.executors.dask.DaskExecutor.place`). The driver steers it
with small calls and receives metadata only::

    stage = LearnerStage(cfg, run_dir, resume)        # placed by the executor
    stage.restore()                                   # --resume: {"loop": driver counters JSON, "steps", "versions"}
    stage.new_version(1, keep=[])                     # -> {"version", "payload_bytes", ...} (+ records)
    out = stage.learn_block(b, target, publish=2, keep=[...])
          # refresh the replay cache from the commit log (the stage reads committed shards itself),
          # the plan's learner calls of block b with the block's sampler RNG, then version 2 if asked
          # -> {"steps": ..., "published": {...} or None, "records": [(kind, step, fields), ...]}
    stage.payload(2)                                  # the version's policy payload (executors publish it)
    stage.save_best(2, eval_json); stage.checkpoint(loop_json, versions=[1, 2], params_of=[2])
    stage.finish(best_version, policy_version)        # final fp32 / actor-precision evaluation

Data flows one way: shards go store -> stage, payloads go stage -> actors
(on Dask from the learner's worker to the actors' workers, see
``DaskExecutor.place``), and metrics come back as ``records`` that the
driver writes to ``metrics.jsonl``. Because the stage follows the plan
(:mod:`pipelines.run.plan`) and TensorFlow runs with op determinism, its
parameters are bit-identical wherever it is placed.
"""
from __future__ import annotations

import json
import os
import socket
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from core import config as config_lib
from core import urls
from pipelines.run import resume as resume_lib
from pipelines.run import stages
from pipelines.run import summary as summary_lib
from pipelines.run.plan import TrainingPlan

Record = Tuple[str, int, Dict[str, Any]]     # (metrics kind, step, fields): one metrics.jsonl record

#: Policy versions whose parameters are kept beyond those still evaluated or best (best checkpoint).
KEEP_VERSIONS = 8


def configure_threads(cfg) -> Dict[str, Any]:
    """Pin TensorFlow's thread pools before TF creates them (see core.config); return the pools in effect.

    TF fixes its pools at its first op in a process and cannot change them later. A run in a process
    where TF already ran with other pools (a notebook that built a model first, a test after another)
    keeps those, and its parameters then differ in the last bits from the same config's run in a fresh
    process (a matmul splits its reduction per thread): it warns, and the ``placement`` record says which
    pools ran (``learner.tf_threads``). ``{"intra_op", "inter_op"}`` (0: TF's default) and ``as_configured``.
    """
    from core.native_logs import quiet_tensorflow_import
    quiet_tensorflow_import()      # wherever the stage runs, an external `dask worker` too: no start-up notices
    import tensorflow as tf
    threading = tf.config.threading
    wanted = {"intra_op": cfg.threads.tf_intra_op, "inter_op": cfg.threads.tf_inter_op}
    for name, n in wanted.items():
        if n:
            try:
                getattr(threading, f"set_{name}_parallelism_threads")(n)
            except RuntimeError:
                pass       # TF already runs with other pools in this process: reported below
    got = {name: int(getattr(threading, f"get_{name}_parallelism_threads")()) for name in wanted}
    unmet = [f"threads.tf_{name}={n} (TF has {got[name] or 'its default'})"
             for name, n in wanted.items() if n and got[name] != n]
    if unmet:
        warnings.warn(f"TensorFlow already ran in this process, so {', '.join(unmet)} cannot apply: this run's "
                      "parameters can differ in the last bits from the same config's in a fresh process "
                      "(python -m pipelines.train)", RuntimeWarning, stacklevel=2)
    return {**got, "as_configured": not unmet}


def learner_parts(cfg, run_dir: str, create_store: bool = False,
                  checkpoint_engine: Optional[Dict[str, Any]] = None, store=None,
                  cache_rows: Optional[int] = None) -> Dict[str, Any]:
    """What every learner stage holds (this one and Beam's, ``pipelines.beam.learner``), built one way.

    Pins TensorFlow's thread pools and turns op determinism on first (same seed, same parameters,
    wherever the stage runs), then returns ``spec``, ``store`` (the run's ``replay``, opened, or
    created with ``create_store``; or the given ``store``: an offline run's fixed dataset), ``ckpt``
    (``checkpoint_engine``: extra Checkpointer options), ``best_ckpt``, ``builder``, ``learner``,
    ``cache`` (``cache_rows`` rows, default ``replay.capacity``), ``sampler``, the actors' ``quantizer``
    and ``tf_threads`` (the pools in effect, :func:`configure_threads`).
    """
    from core.agents.registry import get_builder
    from core.checkpoint import Checkpointer
    from core.envs import env_spec
    from core.quantize import PolicyQuantizer
    from core.replay import ReplayCache, ReplayStore
    tf_threads = configure_threads(cfg)
    import tensorflow as tf
    tf.config.experimental.enable_op_determinism()
    spec = env_spec(cfg.env.id)
    if store is None:
        store_url = urls.join(run_dir, "replay")
        store = (ReplayStore.open_or_create(store_url, env_id=cfg.env.id, **cfg.replay.writer_options())
                 if create_store else ReplayStore.open(store_url, **cfg.replay.writer_options()))
    builder = get_builder(cfg.agent.algo)
    learner = builder.make_learner(spec, cfg.agent, cfg.seed)
    cache = ReplayCache(store, max_transitions=cache_rows or cfg.replay.capacity)
    return {"spec": spec, "store": store, "tf_threads": tf_threads,
            "ckpt": Checkpointer(urls.join(run_dir, "checkpoints"), keep_last=cfg.checkpoint.keep_last,
                                 keep_every=cfg.checkpoint.keep_every, max_workers=cfg.checkpoint.write_threads,
                                 **(checkpoint_engine or {})),
            "best_ckpt": Checkpointer(urls.join(run_dir, "best"), keep_last=1,
                                      max_workers=cfg.checkpoint.write_threads),
            "builder": builder, "learner": learner, "cache": cache,
            "sampler": builder.make_sampler(cache, cfg.agent),
            "quantizer": PolicyQuantizer(cfg.actors.precision, patch=True)}


class LearnerStage:
    """The learner and what only it can compute (see module docstring).

    Args:
      cfg: the run's config.
      run_dir: the run directory (its ``replay`` store exists: the driver creates it).
      async_versions: quantize in a background thread when asked (central mode, non-deterministic).
      dask_client: the driver's client, for ``checkpoint.engine: dask`` (the stage is then in the driver).
      store, cache_rows: another replay store than the run's own, and its cache size (offline training).
    """

    def __init__(self, cfg, run_dir: str, async_versions: bool = False, dask_client=None, store=None,
                 cache_rows: Optional[int] = None):
        from core.quality import BroadcastQualityProbe
        from core.quantize import AsyncQuantizer
        self.cfg, self.run_dir = cfg, run_dir
        vars(self).update(learner_parts(cfg, run_dir, checkpoint_engine=(   # validated: executor dask
            {"engine": "dask", "dask_client": dask_client} if cfg.checkpoint.engine == "dask" else None),
            store=store, cache_rows=cache_rows))
        self.async_quantizer = (AsyncQuantizer(self.learner.policy_model, cfg.actors.precision)
                                if async_versions else None)
        self.plan = TrainingPlan.from_config(cfg)
        self.rng = self.plan.sampler_rng(0)            # replaced per learner block (pipelines.run.plan)
        self.quality = BroadcastQualityProbe(self.spec.discrete, size=256, seed=cfg.seed)
        # where its time went (wall_split)
        self.seconds = {"learn_stage": 0.0, "new_version": 0.0, "refresh_cache": 0.0}
        self.version_params: Dict[int, Any] = {}      # learner params per version (best checkpoint)
        self.version_policy: Dict[int, Any] = {}      # policy-network weights per version (quality probe)
        self.payloads: Dict[int, Any] = {}             # the newest versions' payloads (until published)
        self.records: List[Record] = []                # metrics for the driver, drained by every call

    # -- where and what ------------------------------------------------------------------
    def where(self) -> Dict[str, Any]:
        """``{"address", "host", "pid"}`` of the process that holds the stage (the Dask worker, if any), and
        the TF thread pools its learner runs with (``tf_threads``, :func:`configure_threads`)."""
        try:
            from distributed import get_worker
            address = get_worker().address
        except (ImportError, ValueError):      # not on a worker: the driver process
            address = None
        return {"address": address, "host": socket.gethostname(), "pid": os.getpid(), "tf_threads": self.tf_threads}

    @property
    def steps(self) -> int:
        return int(self.learner.steps)

    def restore(self) -> Dict[str, Any]:
        """Load the latest complete checkpoint: ``{"loop": LoopState JSON, "steps", "versions": [meta, ...]}``.

        ``versions``: the policy versions the checkpoint carries (the payloads
        the blocks after it act with, the parameters of versions still being
        evaluated; see :meth:`checkpoint`), held again for :meth:`payload` and
        :meth:`save_best`. The replay cache is rebuilt as the uninterrupted run
        built it (:func:`pipelines.run.resume.replay_cache`), then a prioritized
        sampler takes its priorities back (``restore_priorities``).
        """
        step = self.ckpt.latest_step()
        if step is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint under {urls.join(self.run_dir, 'checkpoints')}")
        state, meta = self.ckpt.restore(step)
        self.learner.restore(state["learner"])
        versions = [self._restore_version(int(v), m, state.get("versions", {}).get(f"v{v}", {}))
                    for v, m in sorted(meta.get("versions", {}).items(), key=lambda kv: int(kv[0]))]
        resume_lib.replay_cache(self.cache, self.store, json.loads(meta["loop"]).get("block"),
                                meta.get("replay_log_version"))
        if "sampler" in state and hasattr(self.sampler, "restore_priorities"):   # onto the rebuilt cache
            self.sampler.restore_priorities(state["sampler"])
        return {"loop": meta["loop"], "steps": self.steps, "versions": versions}

    def _restore_version(self, version: int, meta: Dict[str, Any], arrays: Dict[str, Any]) -> Dict[str, Any]:
        from core.quantize import PolicyPayload
        payload = PolicyPayload(version, meta["precision"], np.asarray(arrays["payload"], np.uint8).tobytes(),
                                float(meta["convert_seconds"]), int(meta["input_dim"]), int(meta["output_dim"]),
                                meta.get("method", "convert"))
        self.payloads[version] = payload
        if "params" in arrays:
            self.version_params[version] = arrays["params"]
        return {"version": version, "payload_bytes": payload.nbytes, "convert_seconds": payload.convert_seconds,
                "precision": payload.precision}

    def _drain(self) -> List[Record]:
        out, self.records = self.records, []
        return out

    # -- learner blocks ------------------------------------------------------------------
    def learn_block(self, block: int, target: int, publish: Optional[int] = None,
                    keep: Sequence[int] = ()) -> Dict[str, Any]:
        """Train learner block ``block`` up to ``target`` steps on the committed shards of blocks <= ``block``.

        The driver commits block ``block + 1`` only after this returns, so the
        refreshed cache holds exactly the plan's shards. ``publish``: quantize
        that version afterwards (see :meth:`new_version`).
        """
        from pipelines.run.flight import StallError
        t_refresh = time.perf_counter()
        self.refresh_cache(block)
        self.seconds["refresh_cache"] += time.perf_counter() - t_refresh
        calls = self.plan.calls(self.learner.steps, target)
        if calls and self.cache.size < self.cfg.replay.min_size:   # would wait forever: say why instead
            raise StallError(
                f"learner block {block} needs {self.cfg.replay.min_size} replay rows but the cache holds "
                f"{self.cache.size} (replay.capacity={self.cfg.replay.capacity}, shards skipped: "
                f"{len(self.cache.skipped)}); valid: replay.capacity >= replay.min_size and readable shards")
        self.rng = self.plan.sampler_rng(block)
        t_block = time.perf_counter()
        for n in calls:
            t0 = time.time()
            m = stages.learn_stage(self.learner, self.sampler, n, self.cfg.agent.batch_size, self.rng)
            if self.learner.steps % 500 < n:
                self.records.append(("learner", self.steps, {"loss": m["loss"], "q_mean": m["q_mean"],
                                                             "steps_per_s": n / max(time.time() - t0, 1e-9)}))
        t_learned = time.perf_counter()
        published = self._version(publish, keep, blocking=True) if publish is not None else None
        self.seconds["learn_stage"] += t_learned - t_block
        self.seconds["new_version"] += time.perf_counter() - t_learned
        return {"steps": self.steps, "published": published, "records": self._drain()}

    def refresh_cache(self, block: int) -> None:
        """Load the committed shards of the plan's blocks ``<= block`` into the cache (and no later ones)."""
        resume_lib.refresh_cache(self.cache, self.store, block)

    def stage_seconds(self) -> Dict[str, float]:
        """Seconds this stage spent training and making versions in ``learn_block`` (asked once, at the end)."""
        return dict(self.seconds)

    # -- policy versions -----------------------------------------------------------------
    def new_version(self, version: int, keep: Sequence[int] = (), blocking: bool = True) -> Dict[str, Any]:
        """Quantize the learner's policy as ``version``; ``{"published": meta or None, "records"}``.

        ``keep``: versions whose parameters must stay savable (the best, those
        being evaluated). With ``blocking=False`` (central mode) the version
        is converted in the background and :meth:`poll_version` returns it.
        """
        return {"published": self._version(version, keep, blocking), "records": self._drain()}

    def _version(self, version: int, keep: Sequence[int], blocking: bool) -> Optional[Dict[str, Any]]:
        # Parameters only: the full state() also copies optimizer slots (3x more at ActorQ size).
        self.version_params[version] = (self.learner.params() if hasattr(self.learner, "params")
                                        else self.learner.state()["params"])
        self.version_policy[version] = [np.array(w) for w in self.learner.policy_model.get_weights()]
        calib = self.calibration_obs(version)
        if self.async_quantizer is not None and not blocking:
            self.async_quantizer.submit(self.learner.policy_model, version, calib)
            self._keep(version, keep)
            return None
        payload = self.quantizer.quantize(self.learner.policy_model, version=version, calibration_obs=calib)
        self._keep(version, keep)
        return self._published(payload)

    def poll_version(self) -> Dict[str, Any]:
        """A version the background quantizer finished since the last poll, or ``published: None``."""
        payload = self.async_quantizer.latest() if self.async_quantizer is not None else None
        newest = max(self.payloads, default=0)
        published = self._published(payload) if payload is not None and payload.version > newest else None
        return {"published": published, "records": self._drain()}

    def _keep(self, version: int, keep: Sequence[int]) -> None:
        # A slow evaluation (dm_control) may end after more than KEEP_VERSIONS newer versions: its
        # version (and the best) must still be savable as the best checkpoint.
        keep = set(keep)
        for v in [v for v in self.version_params if v < version - KEEP_VERSIONS and v not in keep]:
            del self.version_params[v]
            self.version_policy.pop(v, None)

    def _published(self, payload) -> Dict[str, Any]:
        """Hold ``payload`` for the executor and score its quality vs fp32 in the background (core.quality)."""
        self.payloads[payload.version] = payload
        # Published by then (the executor holds its own reference), but a checkpoint carries the versions
        # the next policy_lag + 1 blocks act with and those being evaluated (at most 3 back).
        for v in [v for v in self.payloads if v <= payload.version - max(self.cfg.actors.policy_lag, 2) - 1]:
            del self.payloads[v]
        self.quality.submit(payload, self.version_policy.get(payload.version), self.learner.policy_model,
                            self.sampler, self.cache)
        for q in self.quality.collect():
            self.records.append(("broadcast_quality", self.steps, q))
        return {"version": int(payload.version), "payload_bytes": int(payload.nbytes),
                "convert_seconds": payload.convert_seconds, "precision": payload.precision}

    def payload(self, version: int):
        """The policy payload of ``version`` (the executor broadcasts or publishes it to actors)."""
        return self.payloads[version]

    def calibration_obs(self, version: int = 0) -> Optional[np.ndarray]:
        """int8-full calibration observations of ``version`` (a stream of its own), else None."""
        if self.cfg.actors.precision != "int8-full":
            return None
        n = self.cfg.actors.calibration_size
        if self.cache.size >= n:   # a stream of its own: calibration never shifts the sampler's
            obs = self.sampler.sample(n, self.plan.calibration_rng(version))["observation"]
        else:  # before any replay: observations from a short random-action rollout
            from core.envs import make_vector_env
            envs, o = make_vector_env(self.cfg.env.id, 8, self.cfg.seed + 999)
            rows = [o]
            while sum(len(r) for r in rows) < n:
                o, *_ = envs.step(envs.action_space.sample())
                rows.append(o)
            envs.close()
            obs = np.concatenate(rows)[:n]
        return obs.reshape(len(obs), -1).astype(np.float32)

    # -- checkpoints ---------------------------------------------------------------------
    def save_best(self, version: int, eval_json: str) -> bool:
        """Save ``version``'s parameters as the best checkpoint; False if they were not kept."""
        params = self.version_params.get(version)
        if params is None:
            return False
        self.best_ckpt.save(version, {"params": params}, donate=True,   # never mutated
                            metadata={"eval": eval_json, "config": config_lib.to_json(self.cfg)})
        return True

    def checkpoint(self, loop_json: str, versions: Sequence[int] = (), params_of: Sequence[int] = ()) -> int:
        """An async checkpoint of the learner state with the driver's counters; returns its step.

        ``versions``: policy versions whose payloads it also carries (the
        flatbuffer bytes, so a resumed run republishes exactly them, int8-full
        calibration included); ``params_of``: versions whose parameters it
        carries (those still being evaluated: the best checkpoint may need them).
        A prioritized sampler's priorities go in ``sampler/`` (16 bytes a cached row).
        """
        tree: Dict[str, Any] = {"learner": self.learner.state()}
        if hasattr(self.sampler, "priority_state"):    # prioritized replay: the priorities, row ids, max
            tree["sampler"] = self.sampler.priority_state()
        kept: Dict[str, Any] = {}
        for v in versions:
            p = self.payloads[v]
            entry = {"payload": np.frombuffer(p.data, np.uint8)}
            if v in params_of and v in self.version_params:
                entry["params"] = self.version_params[v]
            tree.setdefault("versions", {})[f"v{v}"] = entry
            kept[str(v)] = {"precision": p.precision, "convert_seconds": p.convert_seconds,
                            "input_dim": p.input_dim, "output_dim": p.output_dim, "method": p.method}
        self.ckpt.save(self.learner.steps, tree, donate=True,  # fresh host copies; versions are never mutated
                       metadata={"loop": loop_json, "replay_log_version": int(self.store.latest_version()),
                                 "config": config_lib.to_json(self.cfg), "versions": kept})
        return self.steps

    def wait_checkpoints(self) -> None:
        self.ckpt.wait()

    # -- end of run ----------------------------------------------------------------------
    def finish(self, best_version: int, policy_version: int) -> Dict[str, Any]:
        """Evaluate the best (or final) policy at fp32 and at the actors' precision (``final_eval``)."""
        self.ckpt.wait()
        self.best_ckpt.wait()
        summary_lib.restore_best(self.best_ckpt, best_version, self.learner)
        calib = self.calibration_obs(policy_version) if self.cfg.actors.precision == "int8-full" else None
        final = summary_lib.final_evaluation(self.cfg, self.learner, self.builder, self.run_dir,
                                             policy_version, calib)
        for q in self.quality.collect(wait=True):
            self.records.append(("broadcast_quality", self.steps, q))
        return {"final": final, "steps": self.steps, "records": self._drain()}

    def close(self) -> None:
        """Close checkpointers (waiting for their writes), the quantizer thread and the quality probe."""
        self.ckpt.close()
        self.best_ckpt.close()
        if self.async_quantizer is not None:
            self.async_quantizer.close()
        self.quality.close()
