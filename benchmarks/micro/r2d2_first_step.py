"""The R2D2 learner's first step (trace and graph optimization) and its steady step, two checkouts side by side.

An R2D2 learner's first step traces its ``tf.function``: the online and target
unrolls over the sequence and their gradient. A run pays it once per process
that learns: at start-up, and in every Beam round (each round builds its
learner anew). Each measurement is a fresh process of one checkout (``--base``,
``--tree``, alternating, ``--repeats`` times): it builds the learner of
``--config`` (one TensorFlow thread, as the configs run it), feeds it one
synthetic ``[B, L]`` sequence batch (host arrays, as the sampler gives them)
and times the first step, then ``--steps`` more. Medians per checkout and the
ratio tree / base are printed; the losses of the first four steps are printed
too, so a reader sees whether the two compute the same thing.

Example::

    git worktree add /tmp/base HEAD~1
    python benchmarks/micro/r2d2_first_step.py --base /tmp/base --tree . --repeats 3
    # one checkout, XLA off and on, on the pixel config:
    python benchmarks/micro/r2d2_first_step.py --base . --tree . --config configs/catch-r2d2.yaml \
        --set agent.jit_compile=false --tree-set agent.jit_compile=true --steps 20
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.common import git_state, machine_info  # noqa: E402

#: What one measurement process runs, in the checkout given as its working directory.
CHILD = """
import json, os, sys, time
sys.path.insert(0, os.getcwd())
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from core.agents.registry import get_builder
from core.config import load_config
from core.envs import env_spec
cfg = load_config({config!r}, {overrides!r})
spec = env_spec(cfg.env.id)
learner = get_builder("r2d2").make_learner(spec, cfg.agent, 0)
b, length, hs = cfg.agent.batch_size, cfg.agent.sequence_length, cfg.agent.lstm_size
rng = np.random.default_rng(0)
batch = {{"observation": rng.standard_normal((b, length) + tuple(spec.obs_shape)).astype(np.float32),
         "mask": np.ones((b, length), bool), "terminated": np.zeros((b, length), bool),
         "truncated": np.zeros((b, length), bool), "reward": np.ones((b, length), np.float32),
         "discount": np.ones((b, length), np.float32), "action": rng.integers(0, spec.num_actions, (b, length)),
         "extras/lstm_h": np.zeros((b, length, hs), np.float32), "extras/lstm_c": np.zeros((b, length, hs), np.float32),
         "weight": np.ones(b, np.float32)}}
t = time.perf_counter()
losses = [learner.step(batch)["loss"]]
first = time.perf_counter() - t
losses += [learner.step(batch)["loss"] for _ in range(3)]
t = time.perf_counter()
for _ in range({steps}):
    learner.step(batch)
print(json.dumps({{"first_s": first, "step_ms": (time.perf_counter() - t) / {steps} * 1e3, "losses": losses}}))
"""


def measure(tree: str, config: str, steps: int, overrides: List[str]) -> Dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(config=config, steps=steps, overrides=overrides)], cwd=tree,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"error: the measurement in {tree} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/micro/r2d2_first_step.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="checkout before (e.g. a git worktree of the base commit)")
    p.add_argument("--tree", default=".", help="checkout after (default: this one)")
    p.add_argument("--config", default="configs/pomdp-cartpole-r2d2.yaml", help="the R2D2 config (default: POMDP CartPole)")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per checkout, alternating (default 3)")
    p.add_argument("--steps", type=int, default=200, help="steady steps timed after the first four (default 200)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for both checkouts (repeatable)")
    p.add_argument("--tree-set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for --tree only (repeatable): one checkout, two settings, with --base .")
    args = p.parse_args(argv)
    for tree in (args.base, args.tree):
        if not os.path.isfile(os.path.join(tree, args.config)):
            p.error(f"{tree} has no {args.config}: --base and --tree are checkouts of this repository")
    from core.config import ConfigError, load_config
    for overrides in (args.set, args.set + args.tree_set):
        try:
            load_config(os.path.join(args.tree, args.config), overrides)
        except ConfigError as e:
            p.error(str(e))
    runs: Dict[str, List[Dict]] = {"base": [], "tree": []}
    for i in range(args.repeats):
        for name in (("base", "tree") if i % 2 == 0 else ("tree", "base")):
            overrides = args.set + (args.tree_set if name == "tree" else [])
            runs[name].append(measure(getattr(args, name), args.config, args.steps, overrides))
            print(f"repeat {i + 1} {name}: first step {runs[name][-1]['first_s']:.2f} s, "
                  f"steady {runs[name][-1]['step_ms']:.2f} ms", flush=True)
    med = {n: {k: statistics.median(r[k] for r in rs) for k in ("first_s", "step_ms")} for n, rs in runs.items()}
    print(f"\nmachine: {machine_info()}\ncommit: {git_state()}  config: {args.config}  "
          f"--set {args.set}  --tree-set {args.tree_set}")
    print("| checkout | first step (s) | steady step (ms) | losses of steps 1-4 |\n|---|---|---|---|")
    for n in ("base", "tree"):
        print(f"| {n} ({getattr(args, n)}) | {med[n]['first_s']:.2f} | {med[n]['step_ms']:.2f} | "
              f"{', '.join(f'{x:.9g}' for x in runs[n][0]['losses'])} |")
    print(f"\ntree / base: first step {med['tree']['first_s'] / med['base']['first_s']:.2f}x, "
          f"steady step {med['tree']['step_ms'] / med['base']['step_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
