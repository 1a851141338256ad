"""ActorQ's run as costs: what an env step, a learner step and a policy version cost per precision,
and the whole-run env steps/s they predict (a small Amdahl / bottleneck model).

Usage::

    python -m benchmarks.studies.actorq_costs                                     # configs/actorq/cartpole-dqn.yaml
    python -m benchmarks.studies.actorq_costs --config configs/actorq/pendulum-d4pg.yaml --quick
    python -m benchmarks.studies.actorq_costs --out benchmarks/results/actorq_costs-cartpole.json
    python -m benchmarks.studies.actorq_costs --predict benchmarks/results/actorq_costs-cartpole.json \\
        --set learner.replay_ratio=0.01 --set actors.num_actors=8 --cores 16   # model only, no measuring

Measured, per precision, with the config's real stages and networks (median
over ``--repeats``; wall seconds and CPU seconds of this process, so TF's
intra-op threads count):

* ``inference``: ``LiteRTPolicy`` on the actor network, per env step, at
  batch 1 and at the actors' batch (``env.num_envs``), and as the rollout
  stage sees it (``RolloutStats.inference_seconds``);
* ``env``: the vectorized env step alone (random actions), per env step;
* ``rollout``: ``run_rollout_task`` per env step (env + inference + action
  selection + trajectory assembly), the actor task as it runs on a worker;
* ``learner``: ``learn_stage`` per learner step (``agent.batch_size``,
  ``learner.steps_per_call`` steps per call, the config's network, replay
  sampled from shards the rollouts wrote), and ``trace_s``: the first call's
  extra seconds (``tf.function`` tracing);
* ``version``: ``PolicyQuantizer.quantize`` (convert), ``FlatbufferPatcher.patch``
  (where the precision allows), actor-side ``LiteRTPolicy`` load, payload
  bytes, and a Dask ``scatter(broadcast=True)`` to the run's actor workers (``--no-dask`` skips it);
* ``rollout_parallel``: the rollout stage on those Dask workers, every actor's
  tasks chained on its worker and all actors at once, as in the run (not with ``--no-dask``);
* ``corun``: the same parallel rollouts again while this process trains the
  learner beside them, one step per call, as the run's driver does in the
  middle of a run: the learner's seconds per step and the actors' seconds per
  env step when both run at once (CPU sharing, and the memory bandwidth and
  caches a 3x2048 policy's weights contend for, which CPU seconds do not show),
  and fetching a shard write's (small) result from a worker busy with rollouts;
* ``storage``: ``write_shard_stage`` and ``commit_stage`` per env step and per shard, shards
  of one round of tasks (``actors.num_actors`` x ``env.num_envs`` x
  ``actors.steps_per_task`` rows); "commit" includes the learner's replay cache
  refresh that follows each commit in the run (``refresh_shard_s`` on its own);
  ``dispatch_s`` (on the Dask workers): a block's task graph with no work in it,
  submit to result (:func:`block_round_trip`), ``dispatch_submit_s`` of it the
  submit calls of that empty graph and ``driver_gather_s`` fetching the write's
  result, and ``driver_submit_s``: the driver thread's submit calls for a
  block's real tasks (``run_rollout_task`` submits timed in ``rollout_parallel``);
  ``first_write_shard_s`` (on the Dask workers): a fresh worker's first shard
  write, which pays the write engine's imports (:func:`first_shard_writes`).

The model (``benchmarks.studies.actorq_model``, its docstring has the formulas):
steady-state bounds (actors, learner, CPU) and the finite run played out as
the driver's block pipeline. ``benchmarks.studies.actorq_validate`` compares it with
whole runs. The measurements live in ``actorq_costs_process`` (in this process) and
``actorq_costs_workers`` (on Dask workers); this module runs them in order and holds the CLI.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from benchmarks.studies.actorq_costs_process import (_calibration, learner_sampler, measure_env, measure_inference,
                                                     measure_learner, measure_rollouts, measure_storage,
                                                     measure_version, shard_groups)
from benchmarks.studies.actorq_costs_workers import measure_on_workers
from benchmarks.studies.actorq_model import predict, setting  # noqa: F401  (the CLI's model)

DEFAULT_CONFIG = os.path.join("configs", "actorq", "cartpole-dqn.yaml")
PRECISIONS = ("fp32", "int8-dynamic", "int8-full")
SCHEMA = "databloom.actorq_costs/1"


# ------------------------------------------------------------------ measuring

def measure(cfg, precisions: Sequence[str], repeats: int, tasks: int, learner_calls: int,
            dask: bool) -> Dict[str, Any]:
    """Every cost the model needs, for config ``cfg``."""
    from core.agents.registry import get_builder
    from core.envs import env_spec
    from core.replay import ReplayStore
    from pipelines.run.learner_stage import configure_threads
    configure_threads(cfg)
    import tensorflow as tf
    tf.config.experimental.enable_op_determinism()   # as the run's learner (pipelines.run.driver): +~3 s first trace
    spec = env_spec(cfg.env.id)
    builder = get_builder(cfg.agent.algo)
    learner = builder.make_learner(spec, cfg.agent, cfg.seed)
    model = learner.policy_model
    calib = _calibration(cfg.env.id, cfg.actors.calibration_size, cfg.seed)
    out: Dict[str, Any] = {"env": measure_env(cfg, 200), "precisions": {}}
    rollout_results: List[Any] = []
    payloads = {}
    # In-process costs first, one thread at a time (their wall / CPU gives the machine's load,
    # benchmarks.studies.actorq_model.contention); the Dask workers start only afterwards.
    for p in precisions:
        version, payloads[p] = measure_version(model, p, calib, cfg.env.num_envs, cfg.threads.litert, repeats)
        inference = measure_inference(payloads[p], spec.obs_dim, sorted({1, cfg.env.num_envs}), 50,
                                      cfg.threads.litert)
        rollout, results = measure_rollouts(cfg, builder, payloads[p], tasks, f"costs-{p}")
        rollout_results += results
        out["precisions"][p] = {"version": version, "inference": inference, "rollout": rollout}
    with tempfile.TemporaryDirectory(prefix="actorq-costs-") as tmp:
        store_url = os.path.join(tmp, "replay")
        store = ReplayStore.open_or_create(store_url, env_id=cfg.env.id, **cfg.replay.writer_options())
        out["storage"] = measure_storage(cfg, store, store_url, rollout_results, len(rollout_results))
        sampler, cache = learner_sampler(cfg, builder, store)
        out["learner"] = measure_learner(cfg, learner, sampler, cache, learner_calls)
        if dask:
            from pipelines.run import stages
            rng = np.random.default_rng(cfg.seed + 1)
            learn = lambda: stages.learn_stage(learner, sampler, 1, cfg.agent.batch_size, rng)  # noqa: E731
            learn()   # a one-step call's shape (reduce_retracing generalized it already: no new trace)
            measure_on_workers(cfg, builder, payloads, out, repeats, tasks, learn, store_url,
                               shard_groups(cfg, rollout_results)[0])
    return out


# ----------------------------------------------------------------------- CLI

def _table(costs: Dict[str, Any], pred: Dict[str, Any], s: Dict[str, Any]) -> None:
    from pipelines.cli import print_table
    lrn, sto, env = costs["learner"], costs["storage"], costs["env"]
    print(f"\nenv step alone {env['wall_s'] * 1e6:.1f} us/step; learner {lrn['wall_s'] * 1e3:.1f} ms/step "
          f"(CPU {lrn['cpu_s'] * 1e3:.1f} ms; batch {lrn['batch_size']}, {lrn['steps_per_call']}/call); "
          f"shard write {sto['write_s'] * 1e6:.1f} us/step, commit {sto['commit_s'] * 1e6:.1f} us/step")
    rows = []
    for p, c in costs["precisions"].items():
        v, inf = c["version"], c["inference"]
        rows.append([p, *(f"{inf[b]['wall_s'] * 1e6:.1f}" for b in sorted(inf, key=int)),
                     f"{c['rollout']['inference_wall_s'] * 1e6:.1f}", f"{c['rollout']['wall_s'] * 1e6:.1f}",
                     f"{v['convert_s']:.3f}", "-" if v["patch_s"] is None else f"{v['patch_s'] * 1e3:.1f}",
                     f"{v['load_s'] * 1e3:.1f}", "-" if v["bcast_s"] is None else f"{v['bcast_s'] * 1e3:.1f}",
                     v["bytes"]])
    batches = sorted(next(iter(costs["precisions"].values()))["inference"], key=int)
    print_table(["precision", *(f"infer b={b} us/step" for b in batches), "infer in rollout us/step",
                 "rollout us/step", "convert s", "patch ms", "load ms", "scatter ms", "bytes"], rows)
    print(f"\nmodel: replay_ratio {s['replay_ratio']}, {s['num_actors']} actors x {s['num_envs']} envs on "
          f"{min(s['num_actors'], s['workers'])} workers, {s['cores']} cores, broadcast every "
          f"{s['broadcast_period']} learner steps")
    print_table(["precision", "env steps/s", "bound", "actors", "learner", "cpu", "vs fp32",
                 f"time for {s['budget_env_steps']} steps s"],
                [[p, f"{x['env_steps_per_s']:.0f}", x["bound"], *(f"{x['bounds'][k]:.0f}" for k in
                  ("actors", "learner", "cpu")), "-" if x["speedup_vs_fp32"] is None else f"{x['speedup_vs_fp32']:.2f}x", f"{x['time_s']:.0f}"]
                 for p, x in pred.items()])


def main(argv: Optional[Sequence[str]] = None) -> int:
    from core.config import load_config
    from pipelines.cli import cli_errors
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=4, help="rollout tasks per precision")
    ap.add_argument("--learner-calls", type=int, default=2)
    ap.add_argument("--cores", type=int, default=None, help="cores for the model (default: this machine's)")
    ap.add_argument("--env-steps", type=int, default=None, help="env steps to target (default: the budget)")
    ap.add_argument("--no-dask", action="store_true", help="skip the Dask scatter measurement")
    ap.add_argument("--quick", action="store_true", help="1 repeat, 2 tasks, 1 learner call")
    ap.add_argument("--predict", metavar="COSTS_JSON", help="model only, from a stored --out file")
    ap.add_argument("--out", help="write costs, setting and prediction as JSON")
    args = ap.parse_args(argv)
    return cli_errors(_run)(args, load_config)


def _load_costs(path: str) -> Dict[str, Any]:
    from core.config import ConfigError
    with open(path) as f:
        try:
            record = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--predict {path!r} is not JSON ({e.msg} at line {e.lineno}); valid: a file "
                              f"written by --out") from None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise ConfigError(f"--predict {path!r} is not an actorq_costs record; valid: a file with schema {SCHEMA}")
    return record["costs"]


def _run(args, load_config) -> int:
    from core.config import ConfigError
    cfg = load_config(args.config, args.set)
    if args.predict:
        costs = _load_costs(args.predict)
    else:
        if args.quick:
            args.repeats, args.tasks, args.learner_calls = 1, 2, 1
        bad = [p for p in args.precisions if p not in ("fp32", "fp16", "int8-dynamic", "int8-full")]
        if bad:
            raise ConfigError(f"unknown precision {bad[0]!r}; valid: fp32, fp16, int8-dynamic, int8-full")
        costs = measure(cfg, args.precisions, args.repeats, args.tasks, args.learner_calls, not args.no_dask)
    s = setting(cfg, args.cores)
    pred = predict(costs, s, args.env_steps)
    _table(costs, pred, s)
    if args.out:
        record = {"schema": SCHEMA, "config": args.config, "overrides": args.set, "setting": s,
                  "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "load_average": os.getloadavg(), "costs": costs, "prediction": pred}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
