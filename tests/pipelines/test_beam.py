"""Beam executor: runner options, Dataflow readiness, and one round as a pipeline.

Dataflow cannot be reached from CI, so the Dataflow tests build the round's
pipeline for ``DataflowRunner`` and translate it (runner API proto, and the
Dataflow job request when the ``apache-beam[gcp]`` extras are installed)
without submitting anything.
"""
import json
import os
import subprocess
import sys

import pytest

apache_beam = pytest.importorskip("apache_beam")
import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import (DirectOptions, GoogleCloudOptions,  # noqa: E402
                                                  PipelineOptions, SetupOptions, StandardOptions)

from core import config as config_lib  # noqa: E402
from core.config import ConfigError  # noqa: E402
from core.actor import ActorSpec  # noqa: E402
from pipelines.beam import policy_files  # noqa: E402
from pipelines.executors import beam as beam_executor  # noqa: E402
from beam_probes import is_loopback, listening_probe  # noqa: E402

DATAFLOW_ARGS = ["--runner", "DataflowRunner", "--project", "my-project", "--region", "europe-west4",
                 "--temp_location", "gs://my-bucket/tmp", "--job_name", "databloom-test"]


def _tiny_config(**overrides):
    """A tiny CartPole run: blocks of 2 x 4 x 16 = 128 rows, ``replay.min_size`` within the first block."""
    data = {"executor": "beam", "seed": 0, "total_env_steps": 256, "env": {"num_envs": 4},
            "agent": {"hidden": [16]}, "actors": {"num_actors": 2, "steps_per_task": 16},
            "replay": {"min_size": 64, "shard_max_rows": 128}, "learner": {"replay_ratio": 0.5},
            "eval": {"every_env_steps": 128, "episodes": 2, "confirm_episodes": 0}}
    for key, value in overrides.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    return config_lib.from_dict(data)


def _block_run(run_dir, **overrides):
    """A :class:`pipelines.beam.blocks.BlockRun` of :func:`_tiny_config`."""
    from pipelines.beam.blocks import BlockRun
    cfg = _tiny_config(**overrides)
    specs = tuple(ActorSpec("test-run", "CartPole-v1", 4, 0, a) for a in range(2))
    return BlockRun(cfg, run_dir, specs)


def _fake_payload(nbytes, version=1):
    """A PolicyPayload of ``nbytes`` random bytes (an ActorQ-size flatbuffer, for graph-size tests)."""
    from core.quantize import PolicyPayload
    return PolicyPayload(version, "int8-dynamic", os.urandom(nbytes), 0.0, 4, 2)


# -- options ---------------------------------------------------------------------------------
def test_default_is_direct_runner_multi_processing_one_worker_per_core(tmp_path):
    opts = beam_executor.pipeline_options([], str(tmp_path))
    direct = opts.view_as(DirectOptions)
    assert opts.view_as(StandardOptions).runner is None   # Beam's default: DirectRunner
    assert direct.direct_running_mode == "multi_processing"
    assert direct.direct_num_workers == (os.cpu_count() or 1)


def test_user_direct_options_win(tmp_path):
    opts = beam_executor.pipeline_options(["--direct_running_mode=in_memory", "--direct_num_workers", "1"],
                                          str(tmp_path))
    assert opts.view_as(DirectOptions).direct_running_mode == "in_memory"
    assert opts.view_as(DirectOptions).direct_num_workers == 1


@pytest.mark.parametrize("cli", ["pipelines.train", "pipelines.process"])
def test_a_double_dash_before_the_beam_options_is_only_a_separator(tmp_path, cli):
    # Beam's own parser reads everything after "--" as positionals: the options were silently lost, and the
    # runner named after it read as the DirectRunner (round sizing, the run-directory check).
    import importlib
    from pipelines.cli import parse_with_pipeline_args
    parser = importlib.import_module(cli).build_parser()
    argv = ["--run-dir", "r"] if cli == "pipelines.train" else ["stats", "s"]
    _, rest = parse_with_pipeline_args(parser, [*argv, "--", "--runner", "DataflowRunner", "--direct_num_workers", "3"])
    assert rest == ["--runner", "DataflowRunner", "--direct_num_workers", "3"]
    assert beam_executor.runner_name(rest) == "DataflowRunner"
    opts = beam_executor.pipeline_options(rest[2:], str(tmp_path))
    assert opts.view_as(DirectOptions).direct_num_workers == 3
    assert opts.view_as(DirectOptions).direct_running_mode == "multi_processing"


def test_the_direct_runner_runs_on_beams_batch_engine_with_our_worker_command(tmp_path):
    # Not Beam's DirectRunner switch, which first tries Prism (a binary fetched from GitHub): the engine of a
    # local run must not depend on the network. The options the runner reads drop the running mode (it
    # would replace the worker command); the given options, and so what the workers see, keep it.
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.transforms.environments import SubprocessSDKEnvironment
    opts = beam_executor.pipeline_options([], str(tmp_path), num_workers=3)
    runner, run_opts = beam_executor.runner_for(opts)
    assert isinstance(runner, FnApiRunner)
    env = runner._default_environment
    assert isinstance(env, SubprocessSDKEnvironment) and env.command_string == beam_executor.WORKER_COMMAND
    assert beam_executor.WORKER_COMMAND.endswith(" -m pipelines.beam.sdk_worker")
    assert run_opts.view_as(DirectOptions).direct_running_mode == "in_memory"
    assert run_opts.view_as(DirectOptions).direct_num_workers == 3
    assert opts.view_as(DirectOptions).direct_running_mode == "multi_processing"   # the caller's, untouched
    assert run_opts.get_all_options()["default_sdk_harness_log_level"] == "ERROR"


def test_other_direct_modes_keep_their_options_and_other_runners_are_beams_choice(tmp_path):
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    opts = beam_executor.pipeline_options(["--direct_running_mode=in_memory"], str(tmp_path))
    runner, run_opts = beam_executor.runner_for(opts)
    assert isinstance(runner, FnApiRunner) and run_opts is opts
    dataflow = beam_executor.pipeline_options(DATAFLOW_ARGS, "gs://my-bucket/runs/a")
    assert beam_executor.runner_for(dataflow) == (None, dataflow)


@pytest.mark.slow
def test_direct_runner_workers_are_our_worker_module_and_the_pipeline_completes(tmp_path):
    out = tmp_path / "out.json"

    def build(p):
        where = lambda _: (__import__("sys").modules["__main__"].__spec__.name, __import__("os").getpid())  # noqa: E731
        _ = (p | beam.Create([0, 1, 2]) | beam.Map(where) | beam.combiners.ToList()
             | beam.Map(lambda seen: out.write_text(json.dumps(seen))))
    beam_executor.run_pipeline(build, beam_executor.pipeline_options([], str(tmp_path), num_workers=1))
    seen = json.loads(out.read_text())
    assert len(seen) == 3 and {name for name, _ in seen} == {"pipelines.beam.sdk_worker"}
    assert {pid for _, pid in seen} != {os.getpid()}


@pytest.mark.slow
def test_the_runners_servers_for_its_worker_processes_listen_on_loopback_only(tmp_path):
    """Beam binds the FnApiRunner's control, data, state and logging servers, and a per-pipeline worker's
    logging server, to [::] (every interface); runner_for makes them listen on loopback only."""
    out = tmp_path / "listening.json"
    probe = listening_probe(os.getpid())
    beam_executor.run_pipeline(lambda p: p | beam.Create([0]) | beam.Map(probe)
                               | beam.Map(lambda seen: out.write_text(json.dumps(seen))),
                               beam_executor.pipeline_options([], str(tmp_path), num_workers=1))
    seen = json.loads(out.read_text())
    assert len(seen) >= 5, seen                      # the four servers and the worker's logging server
    assert all(is_loopback(ip) for ip, _ in seen), seen


def test_a_wildcard_listening_address_becomes_loopback_and_others_stay():
    from pipelines.executors.beam_loopback import loopback_address
    assert loopback_address("[::]:0") == "localhost:0"
    assert loopback_address("0.0.0.0:8099") == "localhost:8099"
    assert loopback_address(":0") == "localhost:0"
    assert loopback_address("localhost:0") == "localhost:0"
    assert loopback_address("10.0.0.5:0") == "10.0.0.5:0"
    assert loopback_address("[::1]:0") == "[::1]:0"


def test_dataflow_options_pass_through_untouched():
    args = DATAFLOW_ARGS + ["--setup_file", "./setup.py", "--max_num_workers", "7", "--some_future_flag", "x"]
    opts = beam_executor.pipeline_options(args, "gs://my-bucket/runs/a")
    gcp = opts.view_as(GoogleCloudOptions)
    assert (gcp.project, gcp.region, gcp.temp_location) == ("my-project", "europe-west4", "gs://my-bucket/tmp")
    assert opts.view_as(SetupOptions).setup_file == "./setup.py"
    assert opts.view_as(DirectOptions).direct_running_mode == "in_memory"   # no Direct defaults added
    assert "--some_future_flag" in opts.get_all_options(retain_unknown_options=True) or \
        opts.get_all_options(retain_unknown_options=True).get("some_future_flag") == "x"


def test_dataflow_workers_install_the_package_from_setup_py_by_default():
    opts = beam_executor.pipeline_options(DATAFLOW_ARGS, "gs://my-bucket/runs/a")
    setup_file = opts.view_as(SetupOptions).setup_file
    assert setup_file == beam_executor.SETUP_PY and os.path.isfile(setup_file)


@pytest.mark.parametrize("run_dir", ["runs/local", "/tmp/x", "file:///tmp/x", "memory://x"])
def test_remote_runner_rejects_a_run_dir_its_workers_cannot_reach(run_dir):
    with pytest.raises(ConfigError, match="DataflowRunner needs a run directory its workers can reach"):
        beam_executor.pipeline_options(DATAFLOW_ARGS, run_dir)


def test_cli_rejects_local_run_dir_before_anything_starts(tmp_path, capsys):
    from pipelines.train import main
    run_dir = tmp_path / "never-created"
    code = main(["--executor", "beam", "--run-dir", str(run_dir), "--no-progress", *DATAFLOW_ARGS])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: --runner DataflowRunner needs a run directory")
    assert not run_dir.exists()


# -- Dataflow translation (no submission) ----------------------------------------------------
def test_block_round_translates_to_runner_api_for_dataflow():
    """The round pipeline of plan blocks (runner-independent construction: the graph every runner receives):
    three named steps, whatever the round's length."""
    from pipelines.beam.graph import build_block_round
    options = beam_executor.pipeline_options(DATAFLOW_ARGS, "gs://my-bucket/runs/a")
    pipeline = beam.Pipeline(runner="DirectRunner", options=options)
    build_block_round(pipeline, _block_run("gs://my-bucket/runs/a", total_env_steps=8 * 128), 0, 0, 3)
    proto = pipeline.to_runner_api()
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert {"Round", "RunBlocks", "RoundEnd"} <= names, sorted(names)
    assert not any(n.startswith(("RollOut", "Learn", "Commit")) for n in names), sorted(names)


# -- the policy travels by path, never in the job graph --------------------------------------
ACTORQ_INT8_BYTES = 8_600_000     # ActorQ's 3 x 2048 MLP at int8 (fp32: 34 MB)


def _block_graph(run, first, last):
    from pipelines.beam.graph import build_block_round
    pipeline = beam.Pipeline(runner="DirectRunner", options=PipelineOptions([]))
    build_block_round(pipeline, run, 0, first, last)
    return pipeline.to_runner_api().SerializeToString()


def test_block_round_graph_does_not_embed_the_policy_payload(tmp_path):
    """An 8.6 MB payload and a 100-byte one give pipeline protos that differ only in the run dir's name."""
    protos = {}
    for name, nbytes in (("tiny", 100), ("actorq", ACTORQ_INT8_BYTES)):
        run = _block_run(str(tmp_path / name), total_env_steps=8 * 128)
        payload = _fake_payload(nbytes)
        policy_files.write_payload(run.run_dir, payload)   # policies/v000001 under the run dir, not in the graph
        assert os.path.getsize(os.path.join(run.run_dir, "policies", "v000001.tflite")) == nbytes
        protos[name] = _block_graph(run, 0, 3)
        if name == "actorq":
            assert payload.data[1_000_000:1_000_064] not in protos[name]
    assert len(protos["actorq"]) - len(protos["tiny"]) < 1_000, {k: len(v) for k, v in protos.items()}
    assert len(protos["actorq"]) < 500_000, len(protos["actorq"])


def test_block_round_graph_is_the_same_for_1_or_1000_blocks(tmp_path):
    """The graph holds the round's first and last block as numbers, never a step per block: a round of
    1 block, of 16, and of 1,000 in a 4,000-block run translate to protos of the same size (within 1 kB:
    pickled closures vary by tens of bytes from build to build; a step per block would add ~40 kB per
    block), and the policy (an ActorQ-size file) is not in them."""
    policy_files.write_payload(str(tmp_path), _fake_payload(ACTORQ_INT8_BYTES))
    run = _block_run(str(tmp_path), total_env_steps=4_000 * 128)
    sizes = [len(_block_graph(run, first, last)) for first, last in ((8, 8), (8, 23), (3_000, 3_999))]
    assert max(sizes) - min(sizes) < 1_000, sizes
    assert max(sizes) < 100_000, sizes


def _dataflow_job(run, first, last):
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner
    from pipelines.beam.graph import build_block_round
    args = DATAFLOW_ARGS + ["--dry_run=True", "--no_auth", "--sdk_location=container"]
    options = beam_executor.pipeline_options(args, "gs://my-bucket/runs/a")
    pipeline = beam.Pipeline(runner=DataflowRunner(), options=options)
    build_block_round(pipeline, run, 0, first, last)
    return pipeline.run().job


@pytest.mark.slow
def test_dataflow_job_request_stays_small_with_an_actorq_size_policy_and_a_long_round(tmp_path):
    """The translated Dataflow job of a block round (request JSON and pipeline proto) grows neither with
    the payload (the policy is a file in the run directory, read by path) nor with the round's length: a
    2,084-block round (pong-r2d2's whole plan) is the size of a 4-block one, far within the ~10 MB limit."""
    pytest.importorskip("apitools", reason="apache-beam[gcp] extras not installed")
    sizes = {}
    for name, nbytes, blocks in (("tiny", 100, 4), ("actorq", ACTORQ_INT8_BYTES, 4), ("long", 100, 2_084)):
        # The run dir is local here only so that the test can publish a payload without GCS.
        run = _block_run(str(tmp_path / name), total_env_steps=blocks * 128)
        policy_files.write_payload(run.run_dir, _fake_payload(nbytes))
        job = _dataflow_job(run, 0, blocks - 1)
        sizes[name] = (len(job.json()), len(job.proto_pipeline.SerializeToString()))
        names = {t.unique_name for t in job.proto_pipeline.components.transforms.values()}
        assert {"Round", "RunBlocks", "RoundEnd"} <= names, sorted(names)
        assert job.proto.name == "databloom-test"
        envs = list(job.proto_pipeline.components.environments.values())
        assert envs and all(e.urn == "beam:env:docker:v1" for e in envs)
        assert job.options.view_as(SetupOptions).setup_file == beam_executor.SETUP_PY
    print(f"Dataflow dry run, (job request JSON, pipeline proto) bytes: {sizes}")
    for a, b in zip(sizes["tiny"], sizes["actorq"]):
        assert b - a < 1_000, sizes
    for a, b in zip(sizes["tiny"], sizes["long"]):
        assert abs(b - a) < 64, sizes
    assert sum(sizes["long"]) < 1_000_000, sizes


# -- the learner inside the pipeline --------------------------------------------------------
LAUNCHER = """
import json, os, sys
from core import config as config_lib
from pipelines.train import train
summary = train(config_lib.from_dict(json.loads(sys.argv[1])), sys.argv[2], progress=False)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "ai_edge_litert", "tflite_runtime"))
with open(sys.argv[3], "w") as f:
    json.dump({"summary": summary, "heavy": heavy, "pid": os.getpid()}, f)
"""


@pytest.mark.slow
def test_beam_launcher_never_imports_tensorflow_and_the_run_still_learns(tmp_path):
    """The learner runs as the round pipelines' Learn stage (DirectRunner worker processes): the launcher
    process ends its run without TensorFlow, Keras or LiteRT in sys.modules, and the run learns to the
    executor smoke test's threshold (tests/pipelines/test_executors.py: 100), here within 2 rounds (4,096 env
    steps; seed 0 scores 187 at its second evaluation) to halve the test's time."""
    from test_executors import THRESHOLD, assert_complete_run_dir, small_config
    budget = 4_096
    run_dir, out = str(tmp_path / "run"), str(tmp_path / "out.json")
    cfg = small_config("beam", total_env_steps=budget)
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, config_lib.to_json(cfg), run_dir, out],
                          capture_output=True, text=True, timeout=600, cwd=os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")),
                          env={**os.environ, "PYTHONPATH": os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))})
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        result = json.load(f)
    assert result["heavy"] == []
    summary = result["summary"]
    assert summary["executor"] == "beam" and summary["env_steps"] == budget
    assert_complete_run_dir(run_dir, summary)
    learned = max(summary["best_eval_return"], summary["final_eval"]["fp32"]["mean"])
    assert learned >= THRESHOLD, summary
    from pipelines.beam.records import read_record
    blocks = budget // (2 * 8 * 128)
    workers = {read_record(run_dir, b, "learn")["worker"] for b in range(blocks)}
    assert all(not w.endswith(f" pid {result['pid']}") for w in workers), workers   # never the launcher
    assert read_record(run_dir, blocks - 1, "learn")["learner_steps"] == summary["learner_steps"]
    assert 0 < summary["driver_bytes_in_per_env_step"] < 0.01 * summary["trajectory_bytes_per_env_step"]


def _run_blocks(run, first, last, round_index=0):
    from pipelines.beam.graph import build_block_round
    opts = PipelineOptions(["--direct_running_mode", "in_memory", "--direct_num_workers", "1"])
    beam_executor.run_pipeline(lambda p: build_block_round(p, run, round_index, first, last), opts)


def _files(root):
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), root)] = f.read()
    return out


@pytest.mark.slow
def test_a_rerun_round_with_its_learner_changes_nothing(tmp_path):
    """Blocks 0-1 with their Learn stages, run again (a retried pipeline): every stage finds its record,
    nothing is written again: one commit per block, the same checkpoints, policies and records."""
    from core.checkpoint import Checkpointer
    from core.replay import ReplayStore
    from pipelines.beam.records import read_record
    run = _block_run(str(tmp_path / "run"), checkpoint={"every_steps": 64})
    _run_blocks(run, 0, 1)
    first = read_record(run.run_dir, 1, "learn")
    before = {k: v for k, v in _files(run.run_dir).items() if not k.startswith(("metrics", "energy"))}
    _run_blocks(run, 0, 1)
    after = {k: v for k, v in _files(run.run_dir).items() if not k.startswith(("metrics", "energy"))}
    assert sorted(after) == sorted(before)
    changed = sorted(k for k in before if after[k] != before[k] and not k.startswith("rounds/"))
    assert changed == [], changed
    assert read_record(run.run_dir, 1, "learn") == first
    store = ReplayStore.open(os.path.join(run.run_dir, "replay"))
    assert store.latest_version() == 2 and sorted(store.state().live) == ["s00000000", "s00000001"]
    assert first["learner_steps"] == 128 and first["loop"]["env_steps"] == 256    # 0.5 x 2 x 128 rows
    ckpt = Checkpointer(os.path.join(run.run_dir, "checkpoints"))
    try:
        assert ckpt.all_steps() == [64, 128]        # the driver's cadence: every 64 learner steps
    finally:
        ckpt.close()


# -- the plan's rules, as Beam applies them ----------------------------------------------------
def test_evaluation_blocks_follow_the_driver_rule():
    """The driver evaluates after a block whose rows reach the next multiple of eval.every_env_steps
    (once the learner has stepped); Beam places Evaluate<b> stages by the same rule (the same function,
    pipelines.run.block_rules.learn_end), numbered for seeds."""
    from core.config import load_config
    from pipelines.run.block_rules import evaluation_blocks
    from pipelines.run.plan import TrainingPlan
    settings = ["total_env_steps=4096", "eval.every_env_steps=2048"]          # test_determinism's
    assert evaluation_blocks(TrainingPlan.from_config(load_config(overrides=settings)), 2048) == {1: 1, 3: 2}
    default = TrainingPlan.from_config(load_config())                          # 1,024-row blocks, every 4,000
    assert list(evaluation_blocks(default, 4000).items())[:5] == [(3, 1), (7, 2), (11, 3), (15, 4), (19, 5)]
    tiny = TrainingPlan.from_config(_tiny_config(total_env_steps=4 * 128))
    assert evaluation_blocks(tiny, 100) == {0: 1, 1: 2, 2: 3, 3: 4}     # every block crosses a multiple of 100
    late = TrainingPlan.from_config(_tiny_config(total_env_steps=4 * 128, replay={"min_size": 300}))
    assert evaluation_blocks(late, 128) == {2: 1, 3: 2}                 # no learner step before 300 rows


@pytest.mark.parametrize("value", ["0", "x", "-1"])
def test_bad_blocks_per_round_is_one_line_and_exit_2(tmp_path, capsys, value):
    from pipelines.train import main
    run_dir = tmp_path / "never-created"
    code = main(["--executor", "beam", "--run-dir", str(run_dir), "--no-progress", "--blocks_per_round", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: --blocks_per_round {value!r} is not valid; valid: an integer >= 1")
    assert not run_dir.exists()
