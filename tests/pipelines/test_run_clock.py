"""One clock in the summary (pipelines.run.summary.run_clock, pipelines.train.clock_rows): parts that add up."""
import pytest

from pipelines.run import summary as summary_lib


def test_the_clock_splits_time_from_process_start_into_startup_loop_and_end(monkeypatch):
    monkeypatch.setattr(summary_lib, "process_start", lambda: 1000.0)
    records = [{"kind": "config", "time": 1001.0},                        # an earlier segment (resumed run)
               {"kind": "schedule", "time": 1010.0, "wall_s": 9.0},
               {"kind": "config", "time": 1050.0},
               {"kind": "schedule", "time": 1080.0, "wall_s": 24.0}]
    clock = summary_lib.run_clock(records, wall_s=24.0, now=1083.5)
    assert clock == {"since_process_start_s": 83.5, "startup_s": 56.0, "training_loop_s": 24.0,
                     "end_of_run_s": 3.5, "startup_and_end_s": 59.5}
    assert clock["startup_s"] + clock["training_loop_s"] + clock["end_of_run_s"] == clock["since_process_start_s"]


def test_without_a_loop_end_startup_and_end_are_one_part(monkeypatch):
    monkeypatch.setattr(summary_lib, "process_start", lambda: 1000.0)
    clock = summary_lib.run_clock([{"kind": "config", "time": 1002.0}], wall_s=20.0, now=1030.0)
    assert clock == {"since_process_start_s": 30.0, "startup_s": None, "training_loop_s": 20.0,
                     "end_of_run_s": None, "startup_and_end_s": 10.0}


@pytest.mark.parametrize("clock, expected", [
    ({"since_process_start_s": 30.0, "startup_s": 5.0, "training_loop_s": 24.0, "end_of_run_s": 1.0,
      "startup_and_end_s": 6.0},
     [["start-up", "5.0 s (process start to the training loop)"], ["training loop", "24.0 s"],
      ["end of run", "1.0 s (final evaluation, summary)"], ["since process start", "30.0 s (= the rows above)"]]),
    ({"since_process_start_s": 30.0, "startup_s": None, "training_loop_s": 24.0, "end_of_run_s": None,
      "startup_and_end_s": 6.0},
     [["start-up + end of run", "6.0 s"], ["training loop", "24.0 s"], ["since process start", "30.0 s (= the rows above)"]]),
    (None, [["training loop", "24.0 s"]]),
])
def test_the_summary_table_labels_the_parts(clock, expected):
    from pipelines.train import clock_rows
    assert clock_rows({"wall_s": 24.0, "clock": clock}) == expected
