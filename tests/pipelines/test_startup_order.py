"""Start-up order (issue 33): nothing heavy the first env step does not need runs before block 0 is submitted.

* The driver's replay store is opened with the zarr engine (``run_setup.driver_store_options``): it
  never writes shards, and the tensorstore engine would import tensorstore (ml_dtypes alone ~0.8 s)
  in the driver before block 0.
* ``run_with_executor`` starts the executor with nothing importing beside it (TensorFlow on a thread
  slowed the embedded LocalCluster's start 0.8 -> ~2 s on 2 cores); TensorFlow imports with the
  learner, after block 0's rollouts are submitted.

Each check runs in a fresh interpreter, so what this test process imported earlier does not count.
"""
import json
import os
import subprocess
import sys

from core.config import load_config
from pipelines.run.setup import driver_store_options

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=240,
                         env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_driver_store_keeps_the_writer_options_with_the_zarr_engine():
    cfg = load_config(overrides=["replay.chunk_bytes=65536"])
    assert driver_store_options(cfg) == {**cfg.replay.writer_options(), "engine": "zarr"}
    assert driver_store_options(cfg)["chunk_bytes"] == 65536


def test_block_0_is_submitted_before_tensorstore_or_tensorflow_is_imported(tmp_path):
    """A default run (local executor, so no cluster): at block 0's submit the driver has imported neither;
    then the run goes on to its end and commits block 0 (the store the driver created is complete)."""
    code = f"""
import json, sys
from core.config import load_config
from pipelines.executors.local import LocalExecutor
from pipelines.run.driver import Trainer
seen = {{}}
submit = Trainer._submit_uniform_first_block
def spy(self):
    seen.update({{m: m in sys.modules for m in ("tensorstore", "tensorflow", "ml_dtypes")}})
    return submit(self)
Trainer._submit_uniform_first_block = spy
cfg = load_config(overrides=["executor=local", "total_env_steps=1024", "eval.every_env_steps=100000",
                             "carbon.backend=off"])
summary = Trainer(cfg, {str(tmp_path / "run")!r}, LocalExecutor(), progress=False).run()
print(json.dumps({{**seen, "env_steps": summary["env_steps"]}}))
"""
    out = _fresh(code)
    assert out == {"tensorstore": False, "tensorflow": False, "ml_dtypes": False, "env_steps": 1024}


def test_run_with_executor_imports_nothing_beside_the_executor_start():
    """No import thread runs while the executor starts, and TensorFlow is not imported by then."""
    code = """
import json, sys, threading
from pipelines.executors import factory
from core.config import load_config
seen = {}
class Executor:
    def close(self):
        seen["closed"] = True
def make_executor(kind, cfg):
    seen["threads"] = sorted(t.name for t in threading.enumerate() if t.name.startswith("import-"))
    seen["tensorflow"] = "tensorflow" in sys.modules
    return Executor()
class Trainer:
    def __init__(self, cfg, run_dir, executor, progress=True, resume=False):
        pass
    def run(self):
        return {"ran": True}
factory.make_executor = make_executor
print(json.dumps({**factory.run_with_executor(Trainer, load_config(overrides=["executor=dask"]), "unused"), **seen}))
"""
    assert _fresh(code) == {"ran": True, "threads": [], "tensorflow": False, "closed": True}
