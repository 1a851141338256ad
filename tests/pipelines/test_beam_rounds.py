"""Round sizing of Beam runs: the start-up rule, the cost model's first estimate, our options, --show-rounds.

The rule (pipelines/beam/round_size.py): ``J = max(1, floor(B c / (9 S)))`` jobs keep a run's job
start-up ``J S`` within 10% of its wall time ``J S + B c``; rounds of ``ceil(B / J)`` blocks.
"""
import pytest

pytest.importorskip("apache_beam")

from core.config import ConfigError, load_config  # noqa: E402
from pipelines.beam import round_size  # noqa: E402
from pipelines.beam.options import RoundOptions, round_options  # noqa: E402


@pytest.mark.parametrize("blocks, block_s, startup_s, jobs, per_round", [
    (100, 1.0, 1.0, 11, 10),       # budget 100 / 9 = 11.1 start-ups -> 11 jobs of <= 10 blocks
    (2084, 34.0, 180.0, 43, 49),   # floor(2084 * 34 / 1620) = 43
    (10, 1.0, 10.0, 1, 10),        # shorter than ten start-ups: one job
    (59, 1.0, 8.0, 1, 59),         # 59 s of work < 72 s: one job
    (5, 1.0, 0.0, 5, 1),           # free start-up: a job per block
])
def test_the_start_up_rule(blocks, block_s, startup_s, jobs, per_round):
    assert round_size.jobs_within_share(blocks, block_s, startup_s) == jobs
    assert round_size.blocks_per_round(blocks, block_s, startup_s) == per_round


def test_the_rule_keeps_the_share_within_ten_percent_wherever_the_run_allows():
    for blocks in (1, 7, 59, 391, 3125):
        for block_s in (0.05, 1.0, 30.0):
            for startup_s in (8.0, 180.0):
                n = round_size.blocks_per_round(blocks, block_s, startup_s)
                jobs = -(-blocks // n)
                share = round_size.startup_share(jobs, blocks, block_s, startup_s)
                assert share <= 0.1 + 1e-12 or jobs == 1, (blocks, block_s, startup_s, n, share)


def test_startup_share_is_exact():
    assert round_size.startup_share(10, 100, 1.0, 1.0) == pytest.approx(10 / 110)
    assert round_size.startup_share(1, 59, 1.0, 8.0) == pytest.approx(8 / 67)


def test_the_cost_model_estimate_of_the_default_config_by_hand():
    """1,024 rows; MLP 256x256: 131,072 forward FLOPs; actor 10 us + 60/8 us + 131072/20e9 s + 60 us a row;
    learner 3 x 131072 x 64 / 50e9 s + 2 ms a step, 0.25 x 1,024 steps a block (the default's replay ratio)."""
    actor = 1e-5 + 60e-6 / 8 + 131_072 / 20e9 + 60e-6
    learner = 3 * 131_072 * 64 / 50e9 + 2e-3
    expected = 1024 * actor + 0.25 * 1024 * learner
    assert round_size.estimate_block_s(load_config()) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.72692, rel=1e-4)


def test_size_rounds_by_the_rule_and_by_the_override():
    cfg = load_config()
    rule = round_size.size_rounds(cfg, "DataflowRunner", startup_s=180.0)
    assert (rule.plan_blocks, rule.blocks_per_round, rule.jobs, rule.chosen) == (59, 59, 1, "rule")
    fixed = round_size.size_rounds(cfg, "DirectRunner", fixed=16)
    assert (fixed.blocks_per_round, fixed.jobs, fixed.startup_s, fixed.chosen) == (16, 4, 8.0, "--blocks_per_round")
    assert round_size.runner_kind("DataflowRunner") == "dataflow" and round_size.runner_kind("PrismRunner") == "direct"


def test_round_options_are_taken_out_of_the_pipeline_options():
    args, ours = round_options(["--runner", "DataflowRunner", "--blocks_per_round=8", "--round_startup_s", "90.5",
                                "--show-rounds", "--project", "p"])
    assert args == ["--runner", "DataflowRunner", "--project", "p"]
    assert ours == RoundOptions(8, 90.5, True)
    assert round_options([]) == ([], RoundOptions())


@pytest.mark.parametrize("value", ["x", "-1", "nan", "inf"])
def test_bad_round_startup_is_one_line_and_exit_2(tmp_path, capsys, value):
    from pipelines.train import main
    run_dir = tmp_path / "never-created"
    code = main(["--executor", "beam", "--run-dir", str(run_dir), "--no-progress", "--round_startup_s", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: --round_startup_s {value!r} is not valid; valid: a number of seconds >= 0")
    assert not run_dir.exists()
    with pytest.raises(ConfigError):
        round_options(["--round_startup_s", value])


def test_show_rounds_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    from pipelines.train import main
    run_dir = tmp_path / "never-created"
    code = main(["--executor", "beam", "--run-dir", str(run_dir), "--show-rounds", "--blocks_per_round", "16"])
    out = capsys.readouterr().out
    assert code == 0 and not run_dir.exists()
    assert out.startswith("runner DirectRunner: 59 plan blocks, 16 blocks per round (--blocks_per_round), 4 jobs\n")
    assert "8 s a job start-up" in out


@pytest.mark.slow
def test_show_rounds_on_dataflow_needs_no_credentials_and_gives_the_job_request_size(capsys):
    """The issue's command: pong-r2d2 on Dataflow at 180 s a start-up, and the dry run of its largest round."""
    pytest.importorskip("apitools", reason="apache-beam[gcp] extras not installed")
    from pipelines.train import main
    code = main(["--config", "configs/pong-r2d2.yaml", "--executor", "beam", "--runner", "DataflowRunner",
                 "--round_startup_s", "180", "--show-rounds"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert lines[0] == "runner DataflowRunner: 2084 plan blocks, 49 blocks per round (rule), 43 jobs"
    assert "start-up share 9.8% of the run's wall time" in lines[1]
    assert lines[2] == "launcher: 43 jobs of 49 blocks at most"
    assert lines[3].startswith("largest round (49 blocks), Dataflow dry run: job request ")


@pytest.mark.slow
def test_the_dataflow_dry_run_submits_the_jobs_the_plan_announces():
    """pong-vtrace (inference=local) on Dataflow at 180 s a start-up: the plan says 5 jobs of 625 blocks; the
    launcher's own round sequence is 5 rounds covering blocks 0 .. 3,124 once, in order, and each round's
    Dataflow dry run builds a job request within the ~10 MB limit, of the same size whatever its blocks."""
    pytest.importorskip("apitools", reason="apache-beam[gcp] extras not installed")
    from pipelines.beam.rounds import dataflow_request_bytes, launcher_rounds
    cfg = load_config("configs/pong-vtrace.yaml", overrides=["executor=beam", "inference=local"])
    sizing = round_size.size_rounds(cfg, "DataflowRunner", 180.0)
    assert (sizing.plan_blocks, sizing.blocks_per_round, sizing.jobs) == (3125, 625, 5)
    rounds = launcher_rounds(cfg, sizing)
    assert len(rounds) == sizing.jobs
    assert [b for first, last in rounds for b in range(first, last + 1)] == list(range(3125))
    sizes = [dataflow_request_bytes(cfg, last - first + 1, first) for first, last in rounds]
    assert len(sizes) == 5 and all(job + proto < 10_000_000 for job, proto in sizes), sizes
    assert max(p for _, p in sizes) - min(p for _, p in sizes) < 1_000, sizes


def test_the_launcher_sizes_each_round_from_the_previous_one():
    """After a round of 4 blocks that worked 40 s (10 s of it the learner's build, restore and save) in a 50 s
    pipeline: 7.5 s a block, 20 s a start-up; the 55 blocks left -> floor(55 x 7.5 / 180) = 2 jobs of 28."""
    from pipelines.beam.launcher import RoundLauncher
    cfg = load_config()
    launcher = RoundLauncher(cfg, "/nonexistent", None, False, False, round_size.size_rounds(cfg, "DirectRunner"))
    launcher.next_block = 0
    assert launcher._round_blocks() == 59
    launcher._measure({"first_block": 0, "last_block": 3, "work_s": 40.0,
                       "learner_fixed_s": {"build": 6.0, "restore": 3.0, "save": 1.0}}, pipeline_s=50.0)
    assert (launcher.block_s, launcher.startup_s) == (7.5, 20.0)
    launcher.next_block = 4
    assert launcher._round_blocks() == 28
    given = RoundLauncher(cfg, "/nonexistent", None, False, False, round_size.size_rounds(cfg, "DirectRunner", 90.0),
                          startup_given=True)
    given._measure({"first_block": 0, "last_block": 3, "work_s": 40.0, "learner_fixed_s": {}}, pipeline_s=50.0)
    assert (given.block_s, given.startup_s) == (10.0, 90.0)


def test_interrupt_message_names_resume_once_a_beam_round_record_exists(tmp_path):
    """A Beam run stopped before its first periodic checkpoint resumes from its round records."""
    import json
    from pipelines.train import interrupt_message
    run_dir = str(tmp_path / "run")
    (tmp_path / "run" / "rounds").mkdir(parents=True)
    assert interrupt_message(run_dir).startswith("interrupted before the first complete checkpoint; nothing")
    for r, last in ((0, 1), (1, 3)):
        (tmp_path / "run" / "rounds" / f"r{r:06d}.json").write_text(json.dumps({"round": r, "last_block": last}))
    (tmp_path / "run" / "rounds" / "final.json").write_text("{}")             # not a round record
    assert interrupt_message(run_dir) == ("interrupted after Beam round 1 (blocks 0-3 done); resume with: "
                                          f"python -m pipelines.train --resume {run_dir}")
    (tmp_path / "run" / "rounds" / "r000001.json").write_text("{")            # torn: no line about rounds
    assert interrupt_message(run_dir).startswith("interrupted before the first complete checkpoint; nothing")
