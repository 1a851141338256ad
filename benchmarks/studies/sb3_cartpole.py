"""One Stable-Baselines3 run on CartPole-v1 with RL-Zoo settings, timed from process start (for time_to_solve).

``python benchmarks/studies/sb3_cartpole.py --algo dqn|ppo --seed S [--eval-every N] [--confirm-episodes N]``
prints one JSON line: ``time_to_target_s`` (from this process's start,
imports included), ``env_steps_to_target``, ``final_return``, ``env_steps``,
``curve`` (``[env steps, seconds from process start, mean return]`` per
evaluation). Needs ``pip install -e ".[bench]"`` (stable-baselines3, torch).

Evaluation rule, the same as DataBloom's (``core.policy_evaluation``): every
``--eval-every`` env steps, 20 greedy episodes; when their mean reaches 475,
``--confirm-episodes`` more episodes on the same eval env (fresh episodes)
must agree before it counts as the first hit. Training stops at the first
hit unless ``--full-budget`` (then it runs RL-Zoo's ``n_timesteps``).

``--first-step`` measures start-up instead (``benchmarks/micro/startup.py``):
the model is built and trained until its first env step returns, then the
line is ``{"first_step_time": T}`` with ``T`` the wall clock (``time.time()``)
at that moment, so the caller subtracts its own clock from just before it
started this process, as it does for DataBloom's runs.

Settings from rl-baselines3-zoo ``hyperparams/dqn.yml`` and ``ppo.yml``
(CartPole-v1 entries); ``lin_X`` there is a schedule falling linearly from X
to 0 over training.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from core.process_clock import process_start_time  # noqa: E402 - psutil only

START = process_start_time()   # the clock starts at process start, like DataBloom's (core.process_clock)

# SB3 never uses TensorFlow, but its logger imports torch.utils.tensorboard, which imports TensorFlow when it
# is installed (it is, beside DataBloom): 6.5 s of start-up an SB3-only user never pays. Block it, so SB3's
# clock measures SB3 (tensorboard falls back to its own stub).
sys.modules.setdefault("tensorflow", None)

import argparse  # noqa: E402
import json  # noqa: E402

TARGET = 475.0
#: rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1 ("Almost Tuned")
DQN = dict(n_timesteps=50_000, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
           gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
           exploration_final_eps=0.04, net_arch=[256, 256])
#: rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1 ("Tuned"): 8 envs, lr lin_0.001, clip lin_0.2
PPO = dict(n_timesteps=100_000, n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
           ent_coef=0.0, learning_rate=1e-3, clip_range=0.2)


def linear(value):
    return lambda progress_remaining: progress_remaining * value


def build(algo: str, seed: int):
    import gymnasium as gym
    from stable_baselines3 import DQN as SB3DQN, PPO as SB3PPO
    from stable_baselines3.common.env_util import make_vec_env
    if algo == "dqn":
        h = {k: v for k, v in DQN.items() if k not in ("n_timesteps", "net_arch")}
        return SB3DQN("MlpPolicy", gym.make("CartPole-v1"), policy_kwargs=dict(net_arch=DQN["net_arch"]),
                      seed=seed, verbose=0, **h), DQN["n_timesteps"]
    h = {k: v for k, v in PPO.items() if k not in ("n_timesteps", "n_envs", "learning_rate", "clip_range")}
    env = make_vec_env("CartPole-v1", n_envs=PPO["n_envs"], seed=seed)
    return SB3PPO("MlpPolicy", env, learning_rate=linear(PPO["learning_rate"]),
                  clip_range=linear(PPO["clip_range"]), seed=seed, verbose=0, **h), PPO["n_timesteps"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=["dqn", "ppo"], required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--eval-every", type=int, default=4000)
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--confirm-episodes", type=int, default=100)
    p.add_argument("--torch-threads", type=int, default=2)
    p.add_argument("--full-budget", action="store_true", help="train RL-Zoo's n_timesteps even after the hit")
    p.add_argument("--first-step", action="store_true",
                   help="stop at the first env step and print its wall-clock time (start-up, not learning)")
    args = p.parse_args()
    import gymnasium as gym
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    torch.set_num_threads(args.torch_threads)
    model, budget = build(args.algo, args.seed)
    if args.first_step:
        class FirstStep(BaseCallback):
            def _on_step(self) -> bool:     # called after each vector env step: stop at the first
                self.time = time.time()
                return False

        first = FirstStep()
        model.learn(budget, callback=first)
        print(json.dumps({"first_step_time": first.time}))
        return
    eval_env = gym.make("CartPole-v1")
    eval_env.reset(seed=args.seed + 100_000)

    class FirstHit(BaseCallback):
        def __init__(self):
            super().__init__()
            self.next_eval, self.first, self.curve = args.eval_every, None, []

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next_eval:
                return True
            self.next_eval += args.eval_every
            mean, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=args.eval_episodes, deterministic=True)
            self.curve.append([self.num_timesteps, time.time() - START, float(mean)])
            if mean >= TARGET and self.first is None:
                confirmed = mean if args.confirm_episodes == 0 else evaluate_policy(
                    self.model, eval_env, n_eval_episodes=args.confirm_episodes, deterministic=True)[0]
                if confirmed >= TARGET:
                    self.first = (time.time() - START, self.num_timesteps)
                    return args.full_budget   # False stops training
            return True

    cb = FirstHit()
    model.learn(budget, callback=cb)
    final, _ = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes, deterministic=True)
    print(json.dumps({"time_to_target_s": cb.first[0] if cb.first else None,
                      "env_steps_to_target": cb.first[1] if cb.first else None, "final_return": float(final),
                      "env_steps": int(model.num_timesteps), "process_wall_s": time.time() - START,
                      "curve": cb.curve}))


if __name__ == "__main__":
    main()
