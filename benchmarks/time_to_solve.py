"""Wall time and env steps to reach an evaluation return of 475 on CartPole-v1.

Runs ``python -m pipelines.train`` (the default config: double DQN, int8
actors on Dask) for several seeds, each in a fresh process, and reads
``summary.json``: ``time_to_target_s`` counts from process start (imports,
cluster start-up and evaluations included), and a target counts only once a
100-episode confirmation agrees (see core.evaluation). When Stable-Baselines3
is installed (``pip install -e ".[bench]"``) it runs SB3's DQN with the
RL-Zoo CartPole-v1 hyperparameters side by side, seed by seed, in the same
way (fresh process, clock from process start, eval every 2,000 env steps on
20 episodes, 50k env steps), and prints the ratio of medians.

    python benchmarks/time_to_solve.py                 # 3 seeds
    python benchmarks/time_to_solve.py --seeds 0 1 2 3 4 --executor local
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SB3_SCRIPT = textwrap.dedent("""
    import json, sys, time, psutil
    START = psutil.Process().create_time()
    import numpy as np, torch, gymnasium as gym
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    torch.set_num_threads(1)
    seed = int(sys.argv[1])
    class Eval(BaseCallback):
        def __init__(self):
            super().__init__(); self.first = None; self.curve = []
        def _on_step(self):
            if self.num_timesteps % 2000 == 0:
                mean, _ = evaluate_policy(self.model, self.eval_env, n_eval_episodes=20, deterministic=True)
                self.curve.append((self.num_timesteps, float(mean)))
                if mean >= 475 and self.first is None:
                    self.first = (time.time() - START, self.num_timesteps)
            return True
    # RL-Zoo hyperparameters for CartPole-v1 (dqn.yml)
    model = DQN("MlpPolicy", gym.make("CartPole-v1"), learning_rate=2.3e-3, batch_size=64, buffer_size=100000,
                learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]),
                seed=seed, verbose=0)
    cb = Eval(); cb.eval_env = gym.make("CartPole-v1")
    model.learn(50_000, callback=cb)
    final, _ = evaluate_policy(model, cb.eval_env, n_eval_episodes=20, deterministic=True)
    print(json.dumps({"time_to_target_s": cb.first[0] if cb.first else None,
                      "env_steps_to_target": cb.first[1] if cb.first else None,
                      "final_return": float(final), "curve": cb.curve}))
""")


def run_databloom(seed: int, executor: str, extra: list) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pipelines.train", "--no-progress", "--seed", str(seed),
               "--executor", executor, "--run-dir", os.path.join(tmp, "run"), *extra]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        with open(os.path.join(tmp, "run", "summary.json")) as f:
            s = json.load(f)
    final = s["final_eval"][s["precision"]]["mean"]
    return {"time_to_target_s": s["time_to_target_s"], "env_steps_to_target": s["env_steps_to_target"],
            "final_return": final, "env_steps": s["env_steps"], "wall_s": s["wall_s"]}


def run_sb3(seed: int) -> dict | None:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return None
    proc = subprocess.run([sys.executable, "-c", SB3_SCRIPT, str(seed)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(rows, key):
    vals = [r[key] for r in rows if r and r[key] is not None]
    return float(np.median(vals)) if len(vals) == len(rows) else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--executor", default="dask", choices=["local", "dask"])
    p.add_argument("--set", dest="overrides", action="append", default=[], help="config override for DataBloom")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "time_to_solve.json"))
    args = p.parse_args()
    extra = [a for o in args.overrides for a in ("--set", o)]
    ours, theirs = [], []
    for seed in args.seeds:  # interleaved, so machine noise hits both alike
        ours.append(run_databloom(seed, args.executor, extra))
        theirs.append(run_sb3(seed))
        print(f"seed {seed}: databloom {ours[-1]}  sb3 {theirs[-1] and {k: v for k, v in theirs[-1].items() if k != 'curve'}}",
              flush=True)
    from pipelines.cli import print_table
    rows = []
    for seed, o, t in zip(args.seeds, ours, theirs):
        fmt = lambda v, f: "-" if v is None else f.format(v)
        rows.append([seed, fmt(o["time_to_target_s"], "{:.1f}"), fmt(o["env_steps_to_target"], "{:,}"),
                     f"{o['final_return']:.0f}",
                     fmt(t and t["time_to_target_s"], "{:.1f}"), fmt(t and t["env_steps_to_target"], "{:,}"),
                     fmt(t and t["final_return"], "{:.0f}")])
    med = [_median(ours, "time_to_target_s"), _median(ours, "env_steps_to_target")]
    rows.append(["median", f"{med[0]:.1f}", f"{med[1]:,.0f}", "",
                 *([f"{_median(theirs, 'time_to_target_s'):.1f}", f"{_median(theirs, 'env_steps_to_target'):,.0f}", ""]
                   if all(theirs) else ["-", "-", ""])])
    print_table(["seed", "DataBloom s to 475", "DataBloom steps", "DataBloom final (int8)",
                 "SB3 s to 475", "SB3 steps", "SB3 final (50k)"], rows)
    if all(theirs):
        print(f"ratio of median time to 475, SB3 / DataBloom: {_median(theirs, 'time_to_target_s') / med[0]:.2f}x")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"seeds": args.seeds, "databloom": ours, "sb3": theirs, "executor": args.executor}, f, indent=2)


if __name__ == "__main__":
    main()
