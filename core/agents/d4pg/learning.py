"""D4PGLearner: distributional critic + deterministic policy, n-step, target networks.

One update on an n-step batch ``(s, a, R, D, s')`` (see :mod:`losses`)::

    p'      = softmax(Z_target(s', pi_target(s')))          target distribution
    m       = project(R + D z, p')                           onto the support
    L_Z     = mean_B CE(m, Z(s, a))                          critic step (Adam)
    L_pi    = -mean_B Q(s, pi(s)),  Q = sum_i softmax(Z)_i z_i   policy step (Adam)
    targets: soft   theta' <- tau theta + (1 - tau) theta'   every step
             periodic theta' <- theta                        every target_update_period steps

Actions in replay are in env units; the learner normalizes them to the
policy's ``[-1, 1]`` output space (``a_norm = (a - mid) / half``), so the
critic always sees normalized actions.

Example::

    learner = D4PGLearner(env_spec("Pendulum-v1"), cfg.agent, seed=0)
    metrics = learner.step(sampler.sample(256, rng))     # {"loss", "q_mean", "policy_loss", ...}
    payload = quantizer.quantize(learner.policy_model, version=1)
"""
from __future__ import annotations

from typing import Any, Dict

import numpy as np
import tensorflow as tf

from core.agents import variables
from core.agents.d4pg.config import D4PGConfig as AgentConfig
from core.agents.d4pg.losses import categorical_projection, critic_loss, expected_value
from core.agents.d4pg.networks import action_scale, make_networks, support
from core.envs import EnvSpec


class D4PGLearner:
    """Online and target policy/critic networks plus one Adam per network."""

    def __init__(self, spec: EnvSpec, cfg: AgentConfig, seed: int = 0):
        import keras
        if spec.discrete:
            raise ValueError(f"D4PG needs a continuous action space; {spec.env_id} is discrete")
        self.cfg = cfg
        keras.utils.set_random_seed(seed)
        self.act_dim = int(np.prod(spec.action_shape))
        self.policy, self.critic = make_networks(spec.obs_dim, self.act_dim, cfg, seed)
        self.target_policy, self.target_critic = make_networks(spec.obs_dim, self.act_dim, cfg, seed,
                                                               name="target_")
        self.target_policy.set_weights(self.policy.get_weights())
        self.target_critic.set_weights(self.critic.get_weights())
        self.atoms = tf.constant(support(cfg.v_min, cfg.v_max, cfg.num_atoms))
        mid, half = action_scale(spec.action_low, spec.action_high)
        self._mid, self._half = mid, np.where(half > 0, half, 1.0).astype(np.float32)
        self.policy_opt = keras.optimizers.Adam(cfg.policy_learning_rate, global_clipnorm=cfg.max_grad_norm)
        self.critic_opt = keras.optimizers.Adam(cfg.critic_learning_rate, global_clipnorm=cfg.max_grad_norm)
        self.policy_opt.build(self.policy.trainable_variables)
        self.critic_opt.build(self.critic.trainable_variables)
        self.num_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="learner_steps")
        # The K-step loop, traced once; XLA (cfg.jit_compile) compiles it for this CPU on the first call.
        self._train_steps = tf.function(self._k_steps, reduce_retracing=True, jit_compile=cfg.jit_compile)

    @property
    def policy_model(self):
        """The network actors act with (quantized before broadcast)."""
        return self.policy

    def _update(self, obs, action, reward, discount, next_obs):
        """One critic + one policy step; returns (critic loss, policy loss, mean Q(s, a))."""
        next_a = self.target_policy(next_obs)
        next_probs = tf.nn.softmax(self.target_critic(tf.concat([next_obs, next_a], -1)), axis=-1)
        target = tf.stop_gradient(categorical_projection(reward, discount, next_probs, self.atoms))
        with tf.GradientTape() as tape:
            logits = self.critic(tf.concat([obs, action], -1))
            loss = tf.reduce_mean(critic_loss(logits, target))
        grads = tape.gradient(loss, self.critic.trainable_variables)
        self.critic_opt.apply_gradients(zip(grads, self.critic.trainable_variables))
        with tf.GradientTape() as tape:
            q_pi = expected_value(self.critic(tf.concat([obs, self.policy(obs)], -1)), self.atoms)
            policy_loss = -tf.reduce_mean(q_pi)
        grads = tape.gradient(policy_loss, self.policy.trainable_variables)
        self.policy_opt.apply_gradients(zip(grads, self.policy.trainable_variables))
        self.num_steps.assign_add(1)
        self._update_targets()
        return loss, policy_loss, tf.reduce_mean(expected_value(logits, self.atoms))

    def _update_targets(self) -> None:
        pairs = list(zip(self.target_policy.weights + self.target_critic.weights,
                         self.policy.weights + self.critic.weights))
        if self.cfg.target_update == "soft":
            tau = self.cfg.tau
            for t, s in pairs:
                t.assign(tau * s + (1.0 - tau) * t)
        elif self.num_steps % self.cfg.target_update_period == 0:
            for t, s in pairs:
                t.assign(s)

    def _k_steps(self, obs, action, reward, discount, next_obs):
        # K sequential steps in one call: one Python->TF dispatch per K steps.
        k = tf.shape(reward)[0]
        out = [tf.TensorArray(tf.float32, size=k) for _ in range(3)]
        for i in tf.range(k):
            values = self._update(obs[i], action[i], reward[i], discount[i], next_obs[i])
            out = [arr.write(i, v) for arr, v in zip(out, values)]
        return tuple(arr.stack() for arr in out)

    def step(self, batch: Dict[str, np.ndarray]) -> Dict[str, Any]:
        """Gradient steps on an n-step batch: ``[B, ...]`` is one step, ``[K, B, ...]`` is K steps."""
        single = batch["reward"].ndim == 1
        reward = batch["reward"][None] if single else batch["reward"]
        k, b = reward.shape
        obs = batch["observation"].reshape(k, b, -1).astype(np.float32, copy=False)
        next_obs = batch["next_observation"].reshape(k, b, -1).astype(np.float32, copy=False)
        action = (batch["action"].reshape(k, b, self.act_dim).astype(np.float32) - self._mid) / self._half
        loss, policy_loss, q_mean = self._train_steps(
            tf.constant(obs), tf.constant(np.clip(action, -1.0, 1.0)), tf.constant(reward, tf.float32),
            tf.constant(np.reshape(batch["discount"], (k, b)), tf.float32), tf.constant(next_obs))
        return {"loss": float(loss.numpy().mean()), "policy_loss": float(policy_loss.numpy().mean()),
                "q_mean": float(q_mean.numpy().mean())}

    @property
    def steps(self) -> int:
        return int(self.num_steps.numpy())

    # -- checkpoint state ----------------------------------------------------
    def params(self) -> Dict[str, np.ndarray]:
        """The actor network's parameters alone (what a policy version or the best checkpoint needs)."""
        return variables.named(self.policy.weights)

    def state(self) -> Dict[str, Dict[str, np.ndarray]]:
        """Nested host arrays. ``params`` holds the policy only (what evaluation and
        the best-version checkpoint restore); the critic and targets have their own groups."""
        return {
            "params": self.params(),
            "critic_params": variables.named(self.critic.weights),
            "target_params": variables.named(self.target_policy.weights),
            "target_critic_params": variables.named(self.target_critic.weights),
            "optimizer": {**variables.optimizer_state(self.policy_opt, "policy"),
                          **variables.optimizer_state(self.critic_opt, "critic")},
            "counters": {"learner_steps": np.array(self.steps, np.int64)},
        }

    def restore(self, state: Dict[str, Dict[str, np.ndarray]]) -> None:
        """Load a :meth:`state` dict (e.g. from ``Checkpointer.restore``)."""
        variables.assign(self.policy.weights, state["params"])
        for group, model in (("critic_params", self.critic), ("target_params", self.target_policy),
                             ("target_critic_params", self.target_critic)):
            if group in state:
                variables.assign(model.weights, state[group])
        for prefix, optimizer in (("policy", self.policy_opt), ("critic", self.critic_opt)):
            variables.restore_optimizer(optimizer, state.get("optimizer", {}), prefix)
        if "counters" in state:
            self.num_steps.assign(int(np.asarray(state["counters"]["learner_steps"])))
