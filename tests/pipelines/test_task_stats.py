"""The per-task stats a shard write sends the driver: exact round trip, old records, and their size."""
from __future__ import annotations

import pickle
import types

from pipelines.run.task_stats import task_summary, tasks_of


def _stats(actor, task, worker, seconds, steps, version, returns=()):
    return types.SimpleNamespace(actor_id=actor, task_index=task, worker=worker, seconds=seconds, env_steps=steps,
                                 policy_version=version, episode_returns=list(returns))


def test_tasks_come_back_as_the_rows_they_were_with_seconds_to_the_millisecond():
    stats = [_stats(3, 1200, "tcp://10.0.0.7:4001", 0.61249, 64, 5, [21.0, 9.5]),
             _stats(0, 1201, "tcp://10.0.0.8:4001", 1.0, 64, 4),
             _stats(7, 1202, "tcp://10.0.0.7:4001", 0.0004, 32, 5, [200.0])]
    info = task_summary(stats)
    assert info["workers"] == ["tcp://10.0.0.7:4001", "tcp://10.0.0.8:4001"]
    assert tasks_of(info) == [(3, 1200, "tcp://10.0.0.7:4001", 0.612, 64, 5),
                              (0, 1201, "tcp://10.0.0.8:4001", 1.0, 64, 4),
                              (7, 1202, "tcp://10.0.0.7:4001", 0.0, 32, 5)]
    assert (info["episodes"], info["return_sum"], info["returns_tail"]) == (3, 230.5, [21.0, 9.5, 200.0])


def test_records_written_as_row_lists_still_read():
    old = {"tasks": [[3, 1200, "tcp://10.0.0.7:4001", 0.6125, 64, 5]]}
    assert tasks_of(old) == [(3, 1200, "tcp://10.0.0.7:4001", 0.6125, 64, 5)]
    assert tasks_of({}) == [] and tasks_of(task_summary([])) == []


def test_a_blocks_reply_stays_under_one_percent_of_its_cartpole_trajectory_bytes():
    # A 4,096-row block of 64 tasks on 8 workers, CartPole rows (90 bytes each in the committed batch,
    # benchmarks/results/cluster-scale.json): the row layout was 1.3% of that, over issue 30's 1%.
    stats = [_stats(a, 10_000 + a, f"tcp://10.0.0.{a % 8}:40123", 0.6 + a / 1000, 64, 12, [float(a)])
             for a in range(64)]
    reply = len(pickle.dumps(task_summary(stats), protocol=pickle.HIGHEST_PROTOCOL))
    rows = len(pickle.dumps({"tasks": [[s.actor_id, s.task_index, s.worker, round(s.seconds, 4), s.env_steps,
                                        s.policy_version] for s in stats]}, protocol=pickle.HIGHEST_PROTOCOL))
    assert (reply, rows) == (1337, 2907)            # pickled bytes: each address once, no floats per task
    assert reply + 400 < 0.01 * 4096 * 90           # with the reply's other fields (shard id, rows, bytes, ...)
