"""The trajectory batch: what one actor task hands to the replay store.

Rows follow the RLDS step convention, so that the final observation of every
episode is stored (needed to bootstrap at truncation) and no observation is
stored twice:

    row t of env e = (o_t, a_t, r_t, discount_t, terminated_t, truncated_t,
                      episode_id, step_t, policy_version_t, extras_t...)

* ``o_t`` is the observation the agent saw, ``a_t`` the action it took there
  and ``r_t`` the reward received after ``a_t``.
* If ``terminated_t or truncated_t`` the row is the *last* row of its episode:
  ``o_t`` is the final observation, and ``a_t``/``r_t`` are padding (zeros).
  The next row of the same env starts a new episode with ``step == 0``.
* ``discount_t`` is the environment discount attached to ``o_t`` (dm_env
  style): ``0.0`` on a terminated row, ``1.0`` otherwise. Truncation keeps
  discount 1, so learners bootstrap from a truncated final observation.
* ``episode_id`` is globally unique and deterministic:
  ``(stream_id << 32) | episode_counter`` where ``stream_id = actor_id *
  num_envs + env_index``. The successor of row ``(episode_id, step)`` is row
  ``(episode_id, step + 1)``, wherever it is stored; this is how episodes span
  shard boundaries.

A batch is time-major: every field has shape ``[T, E, ...]``.
"""
from __future__ import annotations

import dataclasses
from typing import Dict

import numpy as np

#: Core per-step fields, in storage order, with their dtypes (None = per-env spec).
CORE_FIELDS: Dict[str, object] = {
    "observation": None,
    "action": None,
    "reward": np.float32,
    "discount": np.float32,
    "terminated": np.bool_,
    "truncated": np.bool_,
    "episode_id": np.int64,
    "step": np.int32,
    "policy_version": np.int64,
}


def make_episode_id(stream_id: int | np.ndarray, counter: int | np.ndarray) -> np.ndarray:
    """Deterministic, globally unique episode id: ``(stream_id << 32) | counter``."""
    return (np.asarray(stream_id, np.int64) << 32) | np.asarray(counter, np.int64)


@dataclasses.dataclass
class TrajectoryBatch:
    """Steps collected by one actor task from E environments over T steps.

    Example::

        batch = rollout.run(policy, num_steps=128)       # [128, 8, ...]
        store.write_shard("r000003-s0001", [batch, ...])  # aggregate tasks
    """

    observation: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_id: np.ndarray
    step: np.ndarray
    policy_version: np.ndarray
    extras: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    env_id: str = ""
    actor_id: int = 0
    task_id: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        shape = self.reward.shape
        if len(shape) != 2:
            raise ValueError(f"TrajectoryBatch fields must be [T, E, ...]; reward has shape {shape}")
        for name, value in self.fields().items():
            if value.shape[:2] != shape:
                raise ValueError(
                    f"TrajectoryBatch field {name!r} has leading shape {value.shape[:2]}, expected {shape}")

    @property
    def num_steps(self) -> int:
        return int(self.reward.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.reward.shape[1])

    @property
    def size(self) -> int:
        """Number of rows (T * E)."""
        return int(self.reward.size)

    def fields(self) -> Dict[str, np.ndarray]:
        """All per-step arrays, core fields first, then extras (``extras/<name>``)."""
        out = {name: getattr(self, name) for name in CORE_FIELDS}
        out.update({f"extras/{k}": v for k, v in self.extras.items()})
        return out

    def flat_rows(self) -> Dict[str, np.ndarray]:
        """Fields flattened env-major to ``[E * T, ...]``: each env's steps contiguous."""
        return {name: np.ascontiguousarray(np.swapaxes(v, 0, 1)).reshape((-1,) + v.shape[2:])
                for name, v in self.fields().items()}

    @property
    def nbytes(self) -> int:
        return int(sum(v.nbytes for v in self.fields().values()))
