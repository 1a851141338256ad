"""submit_batch: many calls of one stage at once, with the same keys, order and placement as one submit each.

On Dask a batch is one ``client.map`` per worker (``DaskExecutor.submit_batch``); elsewhere it is one
``submit`` per call. A call may take futures of an earlier batch (an actor's previous rollouts, as
``BlockTasks`` chains blocks): it runs after them and receives their results.
"""
import pytest

from pipelines.executors.common import BatchCall, submit_batch


def chain(actor, task, after=None, tag=None):
    """A task that records what ran before it (the previous task's result, as a dependency's value)."""
    return {"actor": actor, "task": task, "after": after, "tag": tag}


def _batch(task, actors=3, after=None):
    """One batch: each actor's call of ``task``, after its call in the batch before (``after``: futures)."""
    return [BatchCall(args=(a, task), kwargs={"after": None if after is None else after[a], "tag": [task, {"a": a}]},
                      key=f"rollout-x-a{a}-t{task}", actor=a) for a in range(actors)]


def _expected(batches):
    out, last = [], {}
    for calls in batches:
        for c in calls:
            a = c.args[0]
            last[a] = {"actor": a, "task": c.args[1], "after": last.get(a), "tag": c.kwargs["tag"]}
            out.append(last[a])
    return out


def test_without_a_batch_method_each_call_is_one_submit_in_order():
    from pipelines.executors.local import LocalExecutor
    seen = []

    class Recording(LocalExecutor):
        def submit(self, fn, *args, key=None, actor=None, **kwargs):
            seen.append((key, actor))
            after = kwargs.get("after")
            if after is not None:        # the earlier batch's future, already resolved locally
                kwargs["after"] = after.result()
            return super().submit(fn, *args, key=key, actor=actor, **kwargs)

    executor = Recording()
    first = submit_batch(executor, chain, _batch(0))
    second = submit_batch(executor, chain, _batch(1, after=first))
    assert seen == [(c.key, c.actor) for c in _batch(0) + _batch(1)]
    assert [f.result() for f in first + second] == _expected([_batch(0), _batch(1)])


@pytest.mark.slow
def test_dask_batch_is_one_map_per_worker_with_the_same_keys_order_placement_and_dependencies():
    from pipelines.executors.dask import DaskExecutor
    executor = DaskExecutor(n_workers=2)
    try:
        submits, maps = [], []
        real_submit, real_map = executor.client.submit, executor.client.map
        executor.client.submit = lambda *a, **k: submits.append(k) or real_submit(*a, **k)
        executor.client.map = lambda *a, **k: maps.append(k) or real_map(*a, **k)
        first = submit_batch(executor, chain, _batch(0))
        second = submit_batch(executor, chain, _batch(1, after=first))
        futures, calls = first + second, _batch(0) + _batch(1)
        assert [f.key for f in futures] == [c.key for c in calls]
        assert [f.result(timeout=60) for f in futures] == _expected([_batch(0), _batch(1)])
        assert submits == [] and len(maps) == 4                      # actors 0, 2 -> worker 0; actor 1 -> worker 1
        addrs = executor._worker_addresses()
        placed = {c.key: executor.client.who_has([f])[f.key] for c, f in zip(calls, futures)}
        for c in calls:
            assert list(placed[c.key]) == [addrs[c.actor % 2]], c.key
        assert all(m["allow_other_workers"] and m["pure"] is False for m in maps)
        # a block's rollouts go as one task per worker: its actors, and its threads to run them on,
        # grouped by the same pinning as placement()
        assert executor.actor_groups([0, 1, 2, 3, 4]) == [([0, 2, 4], 1), ([1, 3], 1)]
        assert executor.placement(3) == {0: addrs[0], 1: addrs[1], 2: addrs[0]}
    finally:
        executor.close()


def test_a_blocks_rollouts_are_one_task_per_group_of_actors_each_after_their_previous_group():
    """BlockTasks asks the executor how actors share workers (actor_groups) and submits one
    run_rollout_group per group: the group's plan tasks in order, its worker's threads, each actor after
    the task that last ran it; where the executor has no groups, one task per actor."""
    import types
    from core.agents.registry import get_builder
    from core.config import load_config
    from pipelines.run import stages
    from pipelines.run.block_tasks import BlockTasks
    from pipelines.run.flight import LoopState
    from pipelines.run.plan import TrainingPlan

    class Recording:
        def __init__(self, groups):
            self.groups, self.batches = groups, []
            if groups is None:
                self.actor_groups = None

        def actor_groups(self, actors):
            return self.groups

        def submit_batch(self, fn, calls):
            self.batches.append((fn, calls))
            return [f"future-{c.key}" for c in calls]

    cfg = load_config(overrides=["actors.num_actors=4", "actors.steps_per_task=16", "replay.shard_max_rows=1024"])
    for groups, units, threads in (
            ([([0, 2], 2), ([1, 3], 2)], [[(0, 0), (0, 1), (2, 0), (2, 1)], [(1, 0), (1, 1), (3, 0), (3, 1)]], [2, 2]),
            (None, [[(a, 0), (a, 1)] for a in range(4)], [1] * 4)):
        trainer = BlockTasks()      # the trainer's state its rollout steps read
        trainer.__dict__.update(executor=Recording(groups), run_id="r", cfg=cfg, builder=get_builder("dqn"),
                                actor_specs=[f"spec{a}" for a in range(4)], loop=LoopState(next_task=[0] * 4))
        f = types.SimpleNamespace(plan=TrainingPlan.from_config(cfg), block_ref={0: ("payload", 1), 1: ("payload", 2)},
                                  last_task={}, rollout_tasks={})
        assert f.plan.tasks_per_block == 2
        first, second = trainer._submit_block_rollouts(f, 0), trainer._submit_block_rollouts(f, 1)
        assert f.rollout_tasks[0] == units
        assert f.rollout_tasks[1] == [[(a, k + 2) for a, k in unit] for unit in units]
        assert trainer.loop.next_task == [4] * 4
        (fn, calls0), (_, calls1) = trainer.executor.batches
        assert fn is stages.run_rollout_group
        for unit, n, call, later, fut in zip(units, threads, calls0, calls1, first):
            actors = sorted({a for a, _ in unit})
            assert call.key == f"rollout-r-b0-a{actors[0]}" and call.actor == actors[0]
            assert call.args[0] == "payload" and [(s, k) for s, k, *_ in call.args[1]] == [
                (f"spec{a}", k) for a, k in unit]
            assert [capture for *_, capture in call.args[1]] == [k % 2 == 1 for _, k in unit]
            assert call.kwargs == {"after": {}, "threads": n}
            assert later.kwargs["after"] == {a: fut for a in actors}     # each actor after its last group
        assert f.last_task == {a: fut for unit, fut in zip(units, second) for a, _ in unit}
