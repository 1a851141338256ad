"""BCLearner: behaviour cloning for discrete actions (cross-entropy on the dataset's actions).

For a batch of dataset steps ``(o_i, a_i)`` the loss is

    L = - 1/B sum_i log softmax(f(o_i))[a_i]

and the policy acts greedily, ``argmax_a f(o, a)``: the logits network is
what actors and evaluations run (quantized like any policy). It is the
baseline for offline RL: offline DQN should match or beat it on data from a
good policy, and beat it on mixed-quality data.

Example::

    learner = BCLearner(env_spec("CartPole-v1"), BCConfig(), seed=0)
    learner.step(sampler.sample(256, rng))        # {"loss": ..., "q_mean": ...}
"""
from __future__ import annotations

from typing import Any, Dict

import numpy as np
import tensorflow as tf

from core.agents import variables
from core.agents.bc.config import BCConfig
from core.envs import EnvSpec
from core.networks import mlp


class BCLearner:
    def __init__(self, spec: EnvSpec, cfg: BCConfig, seed: int = 0):
        import keras
        if not spec.discrete:
            raise ValueError(f"BC here needs a discrete action space; {spec.env_id} is continuous")
        self.cfg = cfg
        keras.utils.set_random_seed(seed)
        self.net = mlp(spec.obs_dim, cfg.hidden, spec.num_actions, name="bc", seed=seed)
        self.optimizer = keras.optimizers.Adam(learning_rate=cfg.learning_rate, global_clipnorm=cfg.max_grad_norm)
        self.optimizer.build(self.net.trainable_variables)
        self.num_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="learner_steps")

    @property
    def policy_model(self):
        return self.net

    @tf.function(reduce_retracing=True)
    def _train_steps(self, obs, action):
        k = tf.shape(action)[0]
        losses = tf.TensorArray(tf.float32, size=k)
        logit_means = tf.TensorArray(tf.float32, size=k)
        for i in tf.range(k):
            with tf.GradientTape() as tape:
                logits = self.net(obs[i])
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(action[i], logits))
            grads = tape.gradient(loss, self.net.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.net.trainable_variables))
            self.num_steps.assign_add(1)
            losses = losses.write(i, loss)
            logit_means = logit_means.write(i, tf.reduce_mean(tf.reduce_max(logits, axis=-1)))
        return losses.stack(), logit_means.stack()

    def step(self, batch: Dict[str, np.ndarray]) -> Dict[str, Any]:
        """Gradient steps on ``[B]`` (one step) or ``[K, B]`` (K steps) dataset samples."""
        action = batch["action"]
        single = action.ndim == 1
        action = action[None] if single else action
        k, b = action.shape
        obs = batch["observation"].reshape(k, b, -1).astype(np.float32, copy=False)
        losses, logit_mean = self._train_steps(tf.constant(obs), tf.constant(action.astype(np.int32)))
        loss = float(losses.numpy().mean())
        return {"loss": loss, "q_mean": float(logit_mean.numpy().mean()),
                "td_abs": np.full(b if single else (k, b), loss, np.float32)}

    @property
    def steps(self) -> int:
        return int(self.num_steps.numpy())

    def state(self) -> Dict[str, Dict[str, np.ndarray]]:
        return {"params": {_clean(v.path.split("/", 1)[-1]): np.array(v.numpy()) for v in self.net.weights},
                "optimizer": variables.optimizer_state(self.optimizer),
                "counters": {"learner_steps": np.array(self.steps, np.int64)}}

    def restore(self, state: Dict[str, Dict[str, np.ndarray]]) -> None:
        for v in self.net.weights:
            v.assign(state["params"][_clean(v.path.split("/", 1)[-1])])
        variables.restore_optimizer(self.optimizer, state.get("optimizer", {}), strict=True)
        self.num_steps.assign(int(np.asarray(state["counters"]["learner_steps"])))


def _clean(path: str) -> str:
    return path.replace("/", ".")
