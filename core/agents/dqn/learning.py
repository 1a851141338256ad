"""DQNLearner: double DQN with n-step targets and a hard-updated target network.

The learner trains in fp32 with TensorFlow (``tf.function`` steps); actors
never import it. Its state (params, target params, Adam slots, counters) is a
nested dict of numpy arrays for :class:`core.checkpoint.Checkpointer`.

Example::

    learner = DQNLearner(env_spec("CartPole-v1"), cfg.agent, seed=0)
    metrics = learner.step(sampler.sample(64, rng))   # {"loss": ..., "q_mean": ...}
    payload = quantizer.quantize(learner.policy_model, version=1)
"""
from __future__ import annotations

from typing import Any, Dict

import numpy as np
import tensorflow as tf

from core.agents import variables
from core.agents.fused_adam import apply_adam
from core.agents.dqn.losses import huber, q_learning_targets
from core.agents.dqn.config import DQNConfig as AgentConfig
from core.envs import EnvSpec
from core.networks import mlp


class DQNLearner:
    """One learner: online and target Q-networks plus Adam."""

    def __init__(self, spec: EnvSpec, cfg: AgentConfig, seed: int = 0):
        import keras
        if not spec.discrete:
            raise ValueError(f"DQN needs a discrete action space; {spec.env_id} is continuous")
        self.cfg = cfg
        keras.utils.set_random_seed(seed)
        self.q = mlp(spec.obs_dim, cfg.hidden, spec.num_actions, name="q", seed=seed)
        self.target = mlp(spec.obs_dim, cfg.hidden, spec.num_actions, name="q_target", seed=seed)
        self.target.set_weights(self.q.get_weights())
        self.optimizer = keras.optimizers.Adam(learning_rate=cfg.learning_rate,
                                               global_clipnorm=cfg.max_grad_norm)
        self.optimizer.build(self.q.trainable_variables)
        self.num_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="learner_steps")
        # The K-step loop, traced once; XLA (cfg.jit_compile) compiles it for this CPU on the first call.
        self._train_steps = tf.function(self._k_steps, reduce_retracing=True, jit_compile=cfg.jit_compile)

    @property
    def policy_model(self):
        """The network actors act with (quantized before broadcast)."""
        return self.q

    def _update(self, obs, action, reward, discount, next_obs, weight):
        """One gradient step on one batch; returns (loss, td, mean Q(s, a))."""
        q_next = self.q(next_obs)
        q_next_target = self.target(next_obs)
        target = tf.stop_gradient(q_learning_targets(q_next, q_next_target, reward, discount,
                                                     self.cfg.double_q))
        with tf.GradientTape() as tape:
            q = self.q(obs)
            q_taken = tf.gather(q, action, axis=-1, batch_dims=1)
            td = target - q_taken
            loss = tf.reduce_mean(weight * huber(td, self.cfg.huber_delta))
        grads = tape.gradient(loss, self.q.trainable_variables)
        if self.cfg.fused_adam:       # one ResourceApplyAdam per variable (core.agents.fused_adam)
            apply_adam(self.optimizer, grads, self.q.trainable_variables)
        else:
            self.optimizer.apply_gradients(zip(grads, self.q.trainable_variables))
        self.num_steps.assign_add(1)
        if self.num_steps % self.cfg.target_update_period == 0:
            for t, s in zip(self.target.weights, self.q.weights):
                t.assign(s)
        return loss, td, tf.reduce_mean(q_taken)

    def _k_steps(self, obs, action, reward, discount, next_obs, weight):
        # K sequential steps in one call: one Python->TF dispatch per K steps.
        k = tf.shape(reward)[0]
        losses = tf.TensorArray(tf.float32, size=k)
        tds = tf.TensorArray(tf.float32, size=k)
        qs = tf.TensorArray(tf.float32, size=k)
        for i in tf.range(k):
            loss, td, q_mean = self._update(obs[i], action[i], reward[i], discount[i], next_obs[i], weight[i])
            losses = losses.write(i, loss)
            tds = tds.write(i, td)
            qs = qs.write(i, q_mean)
        return losses.stack(), tds.stack(), qs.stack()

    def step(self, batch: Dict[str, np.ndarray]) -> Dict[str, Any]:
        """Gradient steps on an n-step batch from the replay sampler.

        A batch of shape ``[B, ...]`` is one step; ``[K, B, ...]`` is K
        sequential steps (same result as K calls, one dispatch).
        """
        single = batch["reward"].ndim == 1
        reward = batch["reward"][None] if single else batch["reward"]
        k, b = reward.shape
        obs = batch["observation"].reshape(k, b, -1).astype(np.float32, copy=False)
        next_obs = batch["next_observation"].reshape(k, b, -1).astype(np.float32, copy=False)
        weight = batch.get("weight")
        weight = np.ones((k, b), np.float32) if weight is None else np.reshape(weight, (k, b))
        losses, td, q_mean = self._train_steps(
            tf.constant(obs), tf.constant(batch["action"].reshape(k, b).astype(np.int32)),
            tf.constant(reward, tf.float32), tf.constant(np.reshape(batch["discount"], (k, b)), tf.float32),
            tf.constant(next_obs), tf.constant(weight, tf.float32))
        td = np.abs(td.numpy())
        return {"loss": float(losses.numpy().mean()), "q_mean": float(q_mean.numpy().mean()),
                "td_abs": td[0] if single else td}

    @property
    def steps(self) -> int:
        return int(self.num_steps.numpy())

    # -- checkpoint state ----------------------------------------------------
    def params(self) -> Dict[str, np.ndarray]:
        """The policy parameters alone (what a policy version or the best checkpoint needs)."""
        return variables.named(self.q.weights)

    def state(self) -> Dict[str, Dict[str, np.ndarray]]:
        """Nested dict of host arrays: params, target_params, optimizer, counters."""
        return {
            "params": self.params(),
            "target_params": variables.named(self.target.weights),
            "optimizer": variables.optimizer_state(self.optimizer),
            "counters": {"learner_steps": np.array(self.steps, np.int64)},
        }

    def restore(self, state: Dict[str, Dict[str, np.ndarray]]) -> None:
        """Load a :meth:`state` dict (e.g. from ``Checkpointer.restore``)."""
        variables.assign(self.q.weights, state["params"])
        variables.assign(self.target.weights, state["target_params"])
        variables.restore_optimizer(self.optimizer, state.get("optimizer", {}))
        self.num_steps.assign(int(np.asarray(state["counters"]["learner_steps"])))
