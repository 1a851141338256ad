"""Start-up order (issue 33): nothing heavy the first env step does not need runs before block 0 is submitted.

* A replay store builds its write engine at its first write (``ShardWriter.engine``): the driver's store
  never writes shards, so the tensorstore engine's import (ml_dtypes alone ~0.8 s) is not paid before
  block 0; a bad engine is still refused when the store opens.
* ``run_with_executor`` starts the executor with nothing importing beside it (TensorFlow on a thread
  slowed the embedded LocalCluster's start 0.8 -> ~2 s on 2 cores); TensorFlow imports with the
  learner, after block 0's rollouts are submitted.

Each check runs in a fresh interpreter, so what this test process imported earlier does not count.
"""
import json
import os
import subprocess
import sys

import pytest

from core.replay import ReplayError, ReplayStore

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=240,
                         env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_store_imports_its_tensorstore_engine_at_its_first_write_not_when_it_opens(tmp_path):
    code = f"""
import json, sys
sys.path.insert(0, "tests/core/replay")
from replay_fakes import random_batch
from core.replay import ReplayStore
store = ReplayStore.open_or_create({str(tmp_path / "store")!r}, engine="tensorstore")
opened = "tensorstore" in sys.modules
store.commit([store.write_shard("s0", [random_batch(0)]).id])
print(json.dumps({{"opened": opened, "written": "tensorstore" in sys.modules,
                  "engine": type(store.writer.engine).__name__}}))
"""
    assert _fresh(code) == {"opened": False, "written": True, "engine": "_TensorstoreEngine"}


def test_a_bad_engine_is_still_refused_when_the_store_opens(tmp_path):
    with pytest.raises(ReplayError, match="unknown shard write engine 'fast'"):
        ReplayStore.open_or_create(str(tmp_path / "a"), engine="fast")
    with pytest.raises(ReplayError, match="engine 'tensorstore' cannot write"):
        ReplayStore.open_or_create("memory://startup-order", engine="tensorstore")


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
