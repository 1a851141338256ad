"""VTraceLearner: IMPALA actor-critic trained on replayed unrolls with V-trace targets.

Input batches come from :class:`core.replay.SequenceSampler` with length
``unroll_length + frame_stack`` (``T + 1`` rows: ``T`` transitions plus the
bootstrap row, and ``frame_stack - 1`` leading rows that only provide frame
history): every field is ``[B, L, ...]``, or ``[K, B, L, ...]`` for K
sequential steps in one call. Behaviour logits are the ``extras/logits`` the
acting policy produced (LiteRT, int8 or fp32, local or central inference).

Example::

    learner = VTraceLearner(env_spec("CartPole-v1"), VTraceConfig(), seed=0)
    m = learner.step(SequenceSampler(cache, 21, 0).sample(32, rng))   # {"loss", "q_mean", ...}
    payload = quantizer.quantize(learner.policy_model, version=1)
"""
from __future__ import annotations

from typing import Any, Dict

import numpy as np
import tensorflow as tf

from core.agents import variables
from core.agents.vtrace.config import VTraceConfig
from core.agents.vtrace.losses import actor_critic_loss
from core.agents.vtrace.networks import policy_network, value_network


def stack_frames(obs: np.ndarray, k: int, frame_shape) -> np.ndarray:
    """``[K, B, L + k - 1, *frame]`` single frames -> flat stacked inputs ``[K, B, L, prod(frame) * k]``.

    Output step ``j`` stacks stored frames ``j .. j + k - 1`` (oldest first) on
    the channel axis, exactly as the inference server's FrameStacker builds
    the actors' inputs, so replay stores every frame once.
    """
    kk, b, length = obs.shape[:3]
    if k > 1:
        obs = obs.reshape((kk, b, length) + tuple(frame_shape))
        if len(frame_shape) == 2:          # [H, W] frames get a channel axis to stack on
            obs = obs[..., None]
        obs = np.concatenate([obs[:, :, j:length - k + 1 + j] for j in range(k)], axis=-1)
    return obs.reshape(kk, b, length - k + 1, -1).astype(np.float32, copy=False)


def learning_rate(cfg: VTraceConfig):
    """Adam's learning rate: constant, or linear from ``learning_rate`` to ``learning_rate_end``.

    The decay runs on the optimizer's step counter (checkpointed with its
    slots), so a resumed run continues the schedule where it stopped.
    """
    if cfg.learning_rate_decay_steps <= 0:
        return cfg.learning_rate
    import keras
    return keras.optimizers.schedules.PolynomialDecay(cfg.learning_rate, cfg.learning_rate_decay_steps,
                                                      end_learning_rate=cfg.learning_rate_end, power=1.0)


class VTraceLearner:
    """Policy (sent to actors) and value (learner-only) networks trained jointly with Adam."""

    def __init__(self, spec, cfg: VTraceConfig, seed: int = 0):
        import keras
        if not spec.discrete:
            raise ValueError(f"V-trace here needs a discrete action space; {spec.env_id} is continuous")
        self.cfg = cfg
        self.spec = spec
        keras.utils.set_random_seed(seed)
        self.policy = policy_network(spec, cfg, seed)
        self.value = value_network(spec, cfg, seed)
        self.variables = self.policy.trainable_variables + self.value.trainable_variables
        self.optimizer = keras.optimizers.Adam(learning_rate=learning_rate(cfg),
                                               global_clipnorm=cfg.max_grad_norm)
        self.optimizer.build(self.variables)
        self.num_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="learner_steps")

    @property
    def policy_model(self):
        """The logits network actors act with (quantized before broadcast)."""
        return self.policy

    @property
    def history(self) -> int:
        """Leading rows per sequence used only as frame history."""
        return self.cfg.frame_stack - 1

    def _update(self, obs, action, reward, discount, behaviour_logits, valid):
        """One gradient step on ``[B, L]`` sequences (``L = T + 1``)."""
        b, l = tf.shape(reward)[0], tf.shape(reward)[1]
        flat = tf.reshape(obs, [b * l, -1])
        tm = lambda x: tf.transpose(x, [1, 0] + list(range(2, len(x.shape))))  # noqa: E731  [B,L]->[L,B]
        with tf.GradientTape() as tape:
            logits = tf.reshape(self.policy(flat), [b, l, -1])[:, :-1]
            values = tf.reshape(self.value(flat), [b, l])
            loss, m = actor_critic_loss(
                tm(logits), tm(behaviour_logits[:, :-1]), tm(action[:, :-1]), tm(values[:, :-1]),
                tm(values[:, 1:]), tm(reward[:, :-1]), tm(self.cfg.gamma * discount[:, 1:]), tm(valid), self.cfg)
        grads = tape.gradient(loss, self.variables)
        self.optimizer.apply_gradients(zip(grads, self.variables))
        self.num_steps.assign_add(1)
        return loss, m["value_mean"], m["entropy"], m["rho_mean"]

    @tf.function(reduce_retracing=True)
    def _train_steps(self, obs, action, reward, discount, behaviour_logits, valid):
        k = tf.shape(reward)[0]
        out = [tf.TensorArray(tf.float32, size=k) for _ in range(4)]
        for i in tf.range(k):
            vals = self._update(obs[i], action[i], reward[i], discount[i], behaviour_logits[i], valid[i])
            out = [ta.write(i, v) for ta, v in zip(out, vals)]
        return [ta.stack() for ta in out]

    def step(self, batch: Dict[str, np.ndarray]) -> Dict[str, Any]:
        """Gradient steps on sequence batches ``[B, L, ...]`` (one) or ``[K, B, L, ...]`` (K)."""
        single = batch["mask"].ndim == 2
        add = (lambda x: x[None]) if single else (lambda x: x)  # noqa: E731
        mask = add(batch["mask"])
        k, b, length = mask.shape
        h = self.history
        obs = stack_frames(add(batch["observation"]), self.cfg.frame_stack, self.spec.obs_shape)
        cut = lambda x: add(x)[:, :, h:]  # noqa: E731
        last = cut(batch["terminated"]) | cut(batch["truncated"])
        valid = (cut(batch["mask"]) & ~last)[:, :, :-1]
        logits = cut(batch["extras/logits"]).astype(np.float32)
        loss, value_mean, entropy, rho = self._train_steps(
            tf.constant(obs), tf.constant(cut(batch["action"]).astype(np.int32)),
            tf.constant(cut(batch["reward"]), tf.float32), tf.constant(cut(batch["discount"]), tf.float32),
            tf.constant(logits), tf.constant(valid.astype(np.float32)))
        return {"loss": float(loss.numpy().mean()), "q_mean": float(value_mean.numpy().mean()),
                "entropy": float(entropy.numpy().mean()), "rho_mean": float(rho.numpy().mean())}

    @property
    def steps(self) -> int:
        return int(self.num_steps.numpy())

    # -- checkpoint state ----------------------------------------------------
    def params(self) -> Dict[str, np.ndarray]:
        """Policy and value parameters (no optimizer slots): what the best checkpoint keeps."""
        return {**variables.named(self.policy.weights, "policy"), **variables.named(self.value.weights, "value")}

    def state(self) -> Dict[str, Dict[str, np.ndarray]]:
        """Nested host arrays: params (policy + value), optimizer slots, counters."""
        return {
            "params": self.params(),
            "optimizer": variables.optimizer_state(self.optimizer),
            "counters": {"learner_steps": np.array(self.steps, np.int64)},
        }

    def restore(self, state: Dict[str, Dict[str, np.ndarray]]) -> None:
        """Load a :meth:`state` dict (e.g. from ``Checkpointer.restore``)."""
        for prefix, model in (("policy", self.policy), ("value", self.value)):
            # lenient: a best-version checkpoint may hold the policy alone
            variables.assign(model.weights, state["params"], prefix, strict=False)
        variables.restore_optimizer(self.optimizer, state.get("optimizer", {}))
        if "counters" in state:
            self.num_steps.assign(int(np.asarray(state["counters"]["learner_steps"])))
