"""R2D2Learner: recurrent double Q-learning on prioritized replayed sequences.

One step on a batch of ``B`` sequences of ``L`` rows (from
:class:`core.agents.r2d2.sampler.PrioritizedSequenceSampler`)::

    (h0, c0)       = stored actor state at row 0 (extras/lstm_h, extras/lstm_c)
    Q_on, Q_tg     = unroll(online / target net, obs, h0, c0), burn-in rows without gradient
    R, k, D, valid = nstep_indices(...)                 (host side, losses.py)
    y_t            = h(R_t + D_t h^-1(Q_tg(o_{t+k}, argmax Q_on(o_{t+k}))))
    loss           = mean_b w_b * sum_t valid_bt (y_bt - Q_on(o_bt, a_bt))^2 / 2 / sum_t valid_bt
    priority_b     = eta max_t |delta_bt| + (1 - eta) mean_t |delta_bt|   -> returned as "td_abs"

**Pixels** (``frame_stack = k > 1``): replay stores single frames, so the
sampler hands ``L + k - 1`` rows; :meth:`R2D2Learner.prepare` restacks them
with :func:`core.agents.vtrace.learning.stack_frames` (row ``j`` stacks
stored rows ``j .. j + k - 1``, the inference server's and the actors'
order), drops the ``k - 1`` history rows of every other field and starts from
the state stored at row ``k - 1``, the first stacked row. The first ``k - 1``
rows of an episode are therefore history only, never a training row.

The math is in :mod:`core.agents.r2d2.losses`; the network in
:mod:`core.agents.r2d2.networks`. ``step`` returns the new sequence
priorities as ``td_abs`` ``[B]``, which :func:`pipelines.run.stages.learn_stage`
hands to ``sampler.update_priorities(batch["index"], ...)``.

Example::

    learner = R2D2Learner(env_spec("pomdp:CartPole-v1"), R2D2Config(), seed=0)
    m = learner.step(sampler.sample(32, rng))       # {"loss", "q_mean", "td_abs": [32]}
    payload = quantizer.quantize(learner.policy_model, version=1)
"""
from __future__ import annotations

from typing import Any, Dict

import numpy as np
import tensorflow as tf

from core.agents import variables
from core.agents.r2d2.config import R2D2Config
from core.agents.r2d2.losses import double_q_targets, nstep_indices, sequence_priorities
from core.agents.r2d2.networks import recurrent_q_network, unroll
from core.agents.vtrace.learning import stack_frames
from core.agents.vtrace.networks import input_dim


class R2D2Learner:
    """Online and target recurrent Q-networks plus Adam."""

    def __init__(self, spec, cfg: R2D2Config, seed: int = 0):
        import keras
        if not spec.discrete:
            raise ValueError(f"R2D2 needs a discrete action space; {spec.env_id} is continuous")
        if not 0 <= cfg.burn_in < cfg.sequence_length - 1:
            raise ValueError(f"burn_in={cfg.burn_in} must be < sequence_length - 1 = {cfg.sequence_length - 1}")
        self.cfg, self.spec = cfg, spec
        self.num_actions = int(spec.num_actions)
        keras.utils.set_random_seed(seed)
        build = lambda name: recurrent_q_network(  # noqa: E731
            input_dim(spec.obs_shape, cfg.frame_stack), self.num_actions, cfg.torso, cfg.lstm_size, cfg.head,
            name=name, seed=seed, dueling=cfg.dueling, frame_shape=spec.obs_shape, frame_stack=cfg.frame_stack)
        self.q = build("r2d2_q")
        self.target = build("r2d2_q_target")
        self.target.set_weights(self.q.get_weights())
        self.optimizer = keras.optimizers.Adam(learning_rate=cfg.learning_rate, epsilon=cfg.adam_eps,
                                               global_clipnorm=cfg.max_grad_norm)
        self.optimizer.build(self.q.trainable_variables)
        self.num_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="learner_steps")
        # One step, traced once; XLA (cfg.jit_compile) compiles it for this CPU on the first call.
        self._train_step = tf.function(self._update, reduce_retracing=True, jit_compile=cfg.jit_compile)

    @property
    def policy_model(self):
        """The step model actors act with (quantized before broadcast)."""
        return self.q

    def _update(self, obs, h0, c0, action, ret, boot, disc, valid, weight):
        cfg, a = self.cfg, self.num_actions
        q_target = unroll(self.target, obs, h0, c0, a, burn_in=obs.shape[1])     # all without gradient
        with tf.GradientTape() as tape:
            q_online = unroll(self.q, obs, h0, c0, a, burn_in=cfg.burn_in)
            y = tf.stop_gradient(double_q_targets(q_online, q_target, ret, boot, disc, cfg.value_rescaling_eps))
            q_taken = tf.gather(q_online, action, axis=-1, batch_dims=2)
            td = (y - q_taken) * valid
            count = tf.maximum(tf.reduce_sum(valid, axis=1), 1.0)
            per_seq = tf.reduce_sum(0.5 * tf.square(td), axis=1) / count
            loss = tf.reduce_mean(weight * per_seq)
        grads = tape.gradient(loss, self.q.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.q.trainable_variables))
        self.num_steps.assign_add(1)
        if self.num_steps % cfg.target_update_period == 0:
            for t, s in zip(self.target.weights, self.q.weights):
                t.assign(s)
        q_mean = tf.reduce_sum(q_taken * valid) / tf.maximum(tf.reduce_sum(valid), 1.0)
        return loss, td, q_mean

    @property
    def history(self) -> int:
        """Leading rows per sampled sequence used only as frame history (``frame_stack - 1``)."""
        return self.cfg.frame_stack - 1

    def prepare(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Host-side inputs of one step from a ``[B, L + history, ...]`` sequence batch."""
        cfg, k = self.cfg, self.history
        cut = lambda x: x[:, k:]  # noqa: E731   history rows only feed the frame stack
        mask = cut(batch["mask"])
        last = cut(batch["terminated"]) | cut(batch["truncated"])
        ret, boot, disc, valid = nstep_indices(cut(batch["reward"]), cut(batch["discount"]), last, mask,
                                               cfg.n_step, cfg.gamma, cfg.burn_in)
        obs = stack_frames(batch["observation"][None], cfg.frame_stack, self.spec.obs_shape)[0]
        return {"obs": obs, "h0": batch["extras/lstm_h"][:, k].astype(np.float32),
                "c0": batch["extras/lstm_c"][:, k].astype(np.float32),
                "action": cut(batch["action"]).astype(np.int32), "ret": ret, "boot": boot, "disc": disc,
                "valid": valid.astype(np.float32), "weight": np.asarray(batch["weight"], np.float32)}

    def step(self, batch: Dict[str, np.ndarray]) -> Dict[str, Any]:
        """One gradient step on ``[B, L, ...]`` sequences; ``[K, B, L, ...]`` runs K steps in order."""
        if batch["mask"].ndim == 3:
            ms = [self.step({k: v[i] for k, v in batch.items()}) for i in range(batch["mask"].shape[0])]
            return {"loss": float(np.mean([m["loss"] for m in ms])), "q_mean": float(np.mean([m["q_mean"] for m in ms])),
                    "td_abs": np.stack([m["td_abs"] for m in ms])}
        x = self.prepare(batch)
        loss, td, q_mean = self._train_step(*(tf.constant(x[k]) for k in
                                              ("obs", "h0", "c0", "action", "ret", "boot", "disc", "valid", "weight")))
        prio = sequence_priorities(np.abs(td.numpy()), x["valid"] > 0, self.cfg.priority_eta)
        return {"loss": float(loss.numpy()), "q_mean": float(q_mean.numpy()), "td_abs": prio}

    @property
    def steps(self) -> int:
        return int(self.num_steps.numpy())

    # -- checkpoint state ----------------------------------------------------
    def params(self) -> Dict[str, np.ndarray]:
        """The Q-network's parameters alone (what a policy version or the best checkpoint needs)."""
        return _named(self.q.weights)

    def state(self) -> Dict[str, Dict[str, np.ndarray]]:
        """Nested dict of host arrays: params, target_params, optimizer, counters."""
        return {
            "params": self.params(),
            "target_params": _named(self.target.weights),
            "optimizer": variables.optimizer_state(self.optimizer),
            "counters": {"learner_steps": np.array(self.steps, np.int64)},
        }

    def restore(self, state: Dict[str, Dict[str, np.ndarray]]) -> None:
        """Load a :meth:`state` dict (e.g. from ``Checkpointer.restore``)."""
        _assign(self.q.weights, state["params"])
        _assign(self.target.weights, state.get("target_params", state["params"]))
        variables.restore_optimizer(self.optimizer, state.get("optimizer", {}), strict=True)
        if "counters" in state:
            self.num_steps.assign(int(np.asarray(state["counters"]["learner_steps"])))


def _clean(path: str) -> str:
    return path.replace("/", ".")


def _named(weights) -> Dict[str, np.ndarray]:
    # Layer names are explicit (torso_0, lstm_gates, head_0, q), so online and target share keys;
    # the index keeps get_weights() order, which the quality probe's set_weights relies on.
    return {f"{i:02d}.{_clean(v.path)}": np.array(v.numpy()) for i, v in enumerate(weights)}


def _assign(weights, values: Dict[str, np.ndarray]) -> None:
    for i, v in enumerate(weights):
        v.assign(values[f"{i:02d}.{_clean(v.path)}"])
