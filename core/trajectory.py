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

A batch is indexed time-major: every field has shape ``[T, E, ...]``. Producers
allocate fields with ``step_buffer``, which *stores* them env-major (each env's
steps contiguous in memory), the order shards store rows in; writing a shard
is then a plain memory copy instead of a transposing one. Pickling keeps that
layout (see ``TrajectoryBatch.__getstate__``).
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


def step_buffer(num_steps: int, num_envs: int, row_shape: tuple = (), dtype=np.float32,
                fill=None) -> np.ndarray:
    """A ``[T, E, *row_shape]`` array stored env-major; ``fill=None`` leaves it uninitialized.

    Index and assign it like any time-major array (``buf[t] = obs``); only the
    memory order differs.
    """
    shape = (num_envs, num_steps, *row_shape)
    buf = np.empty(shape, dtype) if fill is None else np.full(shape, fill, dtype)
    return buf.swapaxes(0, 1)


def is_env_major(value: np.ndarray) -> bool:
    """Whether a ``[T, E, ...]`` array is stored env-major (as ``step_buffer`` makes it)."""
    return value.ndim >= 2 and np.swapaxes(value, 0, 1).flags.c_contiguous and not value.flags.c_contiguous


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

    def __getstate__(self) -> dict:
        """Pickle env-major fields as their contiguous ``[E, T, ...]`` storage: numpy would
        otherwise pickle a ``[T, E, ...]`` view in C order, i.e. transposed to time-major."""
        state = dict(self.__dict__, extras=dict(self.extras))
        env_major = [name for name, v in self.fields().items() if is_env_major(v)]
        for name in env_major:
            _set_field(state, name, np.swapaxes(_get_field(state, name), 0, 1))
        state["_env_major"] = env_major
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        for name in state.pop("_env_major", []):
            _set_field(state, name, np.swapaxes(_get_field(state, name), 0, 1))
        self.__dict__.update(state)

    def flat_rows(self) -> Dict[str, np.ndarray]:
        """Fields flattened env-major to ``[E * T, ...]``: each env's steps contiguous."""
        return {name: np.ascontiguousarray(np.swapaxes(v, 0, 1)).reshape((-1,) + v.shape[2:])
                for name, v in self.fields().items()}

    @property
    def nbytes(self) -> int:
        return int(sum(v.nbytes for v in self.fields().values()))


def _get_field(state: dict, name: str) -> np.ndarray:
    return state["extras"][name[len("extras/"):]] if name.startswith("extras/") else state[name]


def _set_field(state: dict, name: str, value: np.ndarray) -> None:
    if name.startswith("extras/"):
        state["extras"][name[len("extras/"):]] = value
    else:
        state[name] = value
