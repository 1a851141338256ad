"""Per-broadcast quality metrics also work for sequence agents (V-trace) and recurrent ones (R2D2)."""
import json
import os

import pytest

from core.config import CONFIG_DIR, load_config

TINY = ["executor=local", "total_env_steps=4096", "eval.every_env_steps=100000", "eval.episodes=2",
        "eval.confirm_episodes=0", "actors.broadcast_period=2", "checkpoint.every_steps=100000",
        "replay.min_size=1024", "learner.replay_ratio=0.01", "carbon.backend=off"]


@pytest.mark.slow
@pytest.mark.parametrize("config, precision", [("cartpole-vtrace.yaml", "int8-dynamic"),
                                               ("pomdp-cartpole-r2d2.yaml", "int8-dynamic")])
def test_sequence_and_recurrent_agents_get_broadcast_quality(tmp_path, config, precision):
    from pipelines.train import train
    cfg = load_config(os.path.join(CONFIG_DIR, config), TINY + [f"actors.precision={precision}"])
    run_dir = str(tmp_path / "run")
    train(cfg, run_dir, progress=False)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(l) for l in f]
    quality = [r for r in records if r["kind"] == "broadcast_quality"]
    assert quality, sorted({r["kind"] for r in records})
    for q in quality:
        assert "error" not in q
        assert 0.9 <= q["action_agreement"] <= 1.0 and q["probe_size"] == 256
