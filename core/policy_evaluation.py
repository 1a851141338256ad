"""Policy evaluation: N full episodes with a (quantized) policy, vectorized.

Each of ``episodes`` envs plays exactly one episode (greedy unless
``epsilon > 0``); envs that finish wait for the rest. Seeds are
``seed + i``, so evaluations are reproducible and independent of training
seeds when callers pass a distinct ``seed``.

Example::

    returns = evaluate_payload(payload, "CartPole-v1", episodes=20, seed=10_000)
    returns.mean()
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from core.envs import env_spec, make_vector_env
from core.exploration import SELECTORS, greedy_params, make_carry


def evaluate_payload(payload, env_id: str, episodes: int = 20, seed: int = 10_000,
                     selector: str = "epsilon_greedy", max_episode_steps: Optional[int] = None,
                     num_threads: int = 1, frame_stack: int = 1) -> np.ndarray:
    """Undiscounted returns of ``episodes`` greedy episodes acted by ``payload``'s LiteRT policy.

    ``frame_stack > 1``: the policy sees the last ``frame_stack`` frames, stacked
    by the inference server's FrameStacker, as actors see them on both paths.
    """
    from core.policy import LiteRTPolicy
    envs, obs = make_vector_env(env_id, episodes, seed, max_episode_steps)
    policy = LiteRTPolicy(payload, batch_size=episodes, num_threads=num_threads)
    rng = np.random.default_rng(seed)
    select, params, spec = SELECTORS[selector], greedy_params(selector), env_spec(env_id)
    returns = np.zeros(episodes, np.float64)
    done = np.zeros(episodes, bool)
    carry = make_carry(selector, payload, episodes, spec.obs_dim * frame_stack)   # recurrent policies only
    stacker = None
    if frame_stack > 1:
        from core.inference.frames import FrameStacker   # numpy-only at import; no gRPC
        stacker = FrameStacker(frame_stack)
    first = np.ones(episodes, bool)
    try:
        while not done.all():
            x = (obs if stacker is None else stacker(obs, first)).reshape(episodes, -1).astype(np.float32, copy=False)
            q = policy(x) if carry is None else carry(policy, x, first)[0]
            first[:] = False
            action, _ = select(q, params, rng, spec)
            obs, reward, terminated, truncated, _ = envs.step(action)
            returns += np.where(done, 0.0, reward)
            done |= terminated | truncated
    finally:
        envs.close()
    return returns.astype(np.float32)


def run_evaluation_task(payload, env_id: str, episodes: int, seed: int,
                        max_episode_steps: Optional[int] = None, selector: str = "epsilon_greedy",
                        target: Optional[float] = None, confirm_episodes: int = 0,
                        keep_returns: bool = True, frame_stack: int = 1) -> dict:
    """The evaluation stage as a schedulable task: returns a small JSON-able dict.

    ``keep_returns=False`` leaves out the per-episode ``returns`` (the
    training driver needs the statistics only).

    If the mean return reaches ``target`` and ``confirm_episodes > 0``, the
    same policy plays ``confirm_episodes`` more episodes on fresh seeds and
    ``confirmed_mean`` reports them: 20 lucky episodes do not count as solved.
    """
    returns = evaluate_payload(payload, env_id, episodes, seed, selector, max_episode_steps, frame_stack=frame_stack)
    out = {"version": int(payload.version), "precision": payload.precision, "episodes": episodes,
           "mean": float(returns.mean()), "std": float(returns.std()),
           "min": float(returns.min()), "returns": returns.tolist(), "confirmed_mean": None}
    if target is not None and confirm_episodes > 0 and returns.mean() >= target:
        more = evaluate_payload(payload, env_id, confirm_episodes, seed + 7_777_777, selector, max_episode_steps,
                                frame_stack=frame_stack)
        out["confirmed_mean"] = float(more.mean())
        out["confirm_episodes"] = confirm_episodes
    if not keep_returns:
        del out["returns"]
    return out
