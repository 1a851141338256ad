"""One actor between its tasks: how to build it (ActorSpec) and its live env state (ActorState).

An actor is ``num_envs`` vectorized envs of one env id, seeded from
``(seed, actor_id, task)`` (:func:`env_seed`), plus its observations,
episode bookkeeping, recurrent carry and frame stack. The rollout loop
(:mod:`core.rollout`) steps it; :mod:`core.actor_state` turns its state into
a stored JSON document and back. Between workers the state travels in memory
only: a result's ``next_state`` is a :class:`LiveState`, pickled (snapshotted)
only when it leaves its process, as a :class:`FrozenState`.

Example::

    spec = ActorSpec(run_id="r", env_id="CartPole-v1", num_envs=8, seed=0, actor_id=0)
    state = ActorState(spec, task_index=0)     # envs built from env_seed(spec, 0)
    blob = state.snapshot()                    # bytes in memory, or None if the envs cannot be pickled
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Optional

import numpy as np

from core.envs import env_spec, make_vector_env
from core.exploration import SELECTORS, make_carry
from core.trajectory import make_episode_id


@dataclasses.dataclass(frozen=True)
class ActorSpec:
    """Everything needed to (re)build one actor on any worker."""
    run_id: str
    env_id: str
    num_envs: int
    seed: int
    actor_id: int
    max_episode_steps: Optional[int] = None
    litert_threads: int = 1
    selector: str = "epsilon_greedy"    # action selector in core.exploration
    first_task: int = 0                 # the task the actor is built at from seeds (no state before it)
    frame_stack: int = 1                # pixels: the policy sees the last k frames (replay stores one)

class ActorState:
    """Env state of one actor, persisted between its tasks on one worker."""

    def __init__(self, spec: ActorSpec, task_index: int, incarnation: int = 0):
        self.spec = spec
        # Seeds depend on the task the actor is (re)built at, so a rebuilt
        # actor does not replay the episodes its lost predecessor played.
        self.envs, self.obs = make_vector_env(spec.env_id, spec.num_envs,
                                              seed=env_seed(spec, task_index),
                                              max_episode_steps=spec.max_episode_steps)
        e = spec.num_envs
        # Stream ids < 2**21; a recovery rebuild sets bit 21 (module docstring).
        self.streams = (spec.actor_id * e + np.arange(e, dtype=np.int64)) | (np.int64(incarnation) << 21)
        self.obs_terminated = np.zeros(e, bool)
        self.obs_truncated = np.zeros(e, bool)
        self.step = np.zeros(e, np.int32)
        self.episode_id = make_episode_id(self.streams, np.int64(task_index) << 10)
        self.started_in_task = np.ones(e, np.int64)   # episodes started in `counted_task`
        self.counted_task = task_index
        self.episode_return = np.zeros(e, np.float64)
        self.next_task = task_index
        self.policy = None
        self.carry = None          # recurrent policies: state carried between steps and tasks
        self.stacker = _frame_stacker(spec.frame_stack)   # None without frame stacking
        self.env_spec = env_spec(spec.env_id)
        self.select = SELECTORS[spec.selector]
        self.lock = threading.Lock()   # held while a task steps this state (LiveState never sees it mid-task)

    def snapshot(self) -> Optional[bytes]:
        """This state as bytes (in memory only), or None if the envs cannot be pickled.

        The vector env's ``env_fns`` (closures) are left out: a restored env
        steps its sub-envs and never rebuilds them.
        """
        import pickle
        fields = {k: v for k, v in self.__dict__.items() if k not in ("policy", "envs", "lock")}
        envs = {k: v for k, v in self.envs.__dict__.items() if k != "env_fns"}
        try:
            return pickle.dumps((type(self.envs), envs, fields), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:   # e.g. an emulator handle: such envs are fault-tolerant, not bit-identical
            return None

    @classmethod
    def restore(cls, blob: bytes) -> "ActorState":
        """The state :meth:`snapshot` captured (its policy is set again by the next task)."""
        import pickle
        env_type, envs, fields = pickle.loads(blob)
        state = cls.__new__(cls)
        state.__dict__.update(fields)
        state.envs = env_type.__new__(env_type)
        state.envs.__dict__.update(envs)
        state.envs.env_fns = None
        state.policy = None
        state.lock = threading.Lock()
        return state

    def set_policy(self, payload) -> None:
        from core.policy import LiteRTPolicy  # actors import LiteRT, never TF
        if self.policy is None:
            self.policy = LiteRTPolicy(payload, batch_size=self.spec.num_envs,
                                       num_threads=self.spec.litert_threads)
            if not getattr(self, "has_carry", False):   # a restored state keeps its recurrent carry
                self.carry = make_carry(self.spec.selector, payload, self.spec.num_envs,
                                        self.env_spec.obs_dim * self.spec.frame_stack)
                self.has_carry = True
        elif self.policy.version != payload.version:
            self.policy.update(payload)


class LiveState:
    """An actor's state after task ``task_index``, snapshotted only if it is pickled (sent away).

    Pickles as a :class:`FrozenState` holding :meth:`ActorState.snapshot`'s
    bytes, or None when the actor has moved on (or is mid-task) by then: a
    receiver then rebuilds the actor (fault-tolerant, not bit-identical).
    """

    def __init__(self, state: ActorState, task_index: int):
        self.state, self.task_index = state, task_index

    def blob(self) -> Optional[bytes]:
        if not self.state.lock.acquire(blocking=False):
            return None
        try:
            return self.state.snapshot() if self.state.next_task == self.task_index + 1 else None
        finally:
            self.state.lock.release()

    def __reduce__(self):
        return FrozenState, (self.blob(),)


class FrozenState:
    """A :class:`LiveState` after it was pickled: the snapshot bytes (or None)."""

    def __init__(self, blob: Optional[bytes]):
        self._blob = blob

    def blob(self) -> Optional[bytes]:
        return self._blob


def _frame_stacker(k: int):
    """The inference server's FrameStacker for ``k > 1`` (one stacking rule for both paths), else None."""
    if k <= 1:
        return None
    from core.inference.frames import FrameStacker   # numpy-only at import; no gRPC
    return FrameStacker(k)


def env_seed(spec: ActorSpec, task_index: int) -> int:
    """The seed actor ``spec.actor_id``'s envs are built from for task ``task_index`` (local or central)."""
    return int(np.random.SeedSequence([spec.seed, spec.actor_id, task_index]).generate_state(1)[0] % (2**31 - 1))
