"""Run on a host of the multi-host test (``test_multihost.py``) to see what the store holds.

The test process is not on the hosts' network, so what it needs from the store
comes through a process started on one of them (the file system is shared)::

    python multihost_probe.py watch s3://runs/r        # one JSON line per change: log version, checkpoint
    python multihost_probe.py export s3://runs/r OUT   # OUT/params.npz, OUT/summary.json, OUT/metrics.jsonl
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def watch(run_url: str) -> None:
    """Print ``{"log": latest replay log version, "checkpoint": latest complete checkpoint step}`` on change."""
    from core import urls
    from core.checkpoint import Checkpointer
    fs, path = urls.resolve(urls.join(run_url, "replay", "log"))
    last = None
    while True:
        try:
            fs.invalidate_cache()
            names = [p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]
            log = max([int(n[:20]) for n in names if n.endswith(".json") and n[:20].isdigit()
                       and len(n) == len("00000000000000000001.json")], default=0)
            ckpt = Checkpointer(urls.join(run_url, "checkpoints"))
            step = ckpt.latest_step()
            ckpt.close()
        except (FileNotFoundError, OSError):
            log, step = 0, None
        if (log, step) != last:
            print(json.dumps({"log": log, "checkpoint": step, "time": time.time()}), flush=True)
            last = (log, step)
        time.sleep(0.2)


def export(run_url: str, out: str) -> None:
    """The run's final learner parameters, summary and metrics, copied to the local directory ``out``."""
    import numpy as np
    from core import urls
    from core.checkpoint import Checkpointer
    os.makedirs(out, exist_ok=True)
    ckpt = Checkpointer(urls.join(run_url, "checkpoints"))
    state, _ = ckpt.restore(select=["learner/params"])
    ckpt.close()
    np.savez(os.path.join(out, "params.npz"), **{k: np.asarray(v) for k, v in _flat(state["learner"]["params"])})
    fs, path = urls.resolve(run_url)
    for name in ("summary.json", "metrics.jsonl"):
        if fs.exists(f"{path}/{name}"):
            with open(os.path.join(out, name), "wb") as f:
                f.write(fs.cat_file(f"{path}/{name}"))


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flat(v, f"{prefix}{k}/")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _flat(v, f"{prefix}{i}/")
    else:
        yield prefix.rstrip("/"), tree


if __name__ == "__main__":
    {"watch": watch, "export": export}[sys.argv[1]](*sys.argv[2:])
