"""Run on a host of the multi-host test (``test_multihost.py``) to see what the store holds.

The test process is not on the hosts' network, so what it needs from the store
comes through a process started on one of them (the file system is shared)::

    python multihost_probe.py serve IP PORT BUCKET      # the store host: an S3 server with BUCKET in it
    python multihost_probe.py watch s3://runs/r        # one JSON line per change: log version, checkpoint
    python multihost_probe.py copy s3://runs/r DIR     # the whole run directory, copied to the local DIR
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def serve(ip: str, port: str, bucket: str) -> None:
    """moto's S3 server on ``ip:port`` with ``bucket`` made; prints ``ready`` once it answers.

    PUTs are handled one at a time: moto checks ``If-None-Match`` and stores the object in two
    steps, while S3 decides a conditional PUT atomically per key (see tests/core/replay/test_replay_s3.py).
    """
    import logging
    import threading
    import boto3
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.WARNING)     # one line per request otherwise
    server = ThreadedMotoServer(ip_address=ip, port=int(port), verbose=False)
    server.start()
    app, lock = server._server.app, threading.Lock()

    def one_put_at_a_time(environ, start_response):
        if environ["REQUEST_METHOD"] != "PUT":
            return app(environ, start_response)
        with lock:
            return app(environ, start_response)
    server._server.app = one_put_at_a_time
    boto3.client("s3", endpoint_url=f"http://{ip}:{port}", region_name=os.environ.get("AWS_REGION", "us-east-1")
                 ).create_bucket(Bucket=bucket)
    print("ready", flush=True)
    threading.Event().wait()


def copy(run_url: str, out: str) -> None:
    """Every object under ``run_url`` copied to the local directory ``out`` (same relative paths)."""
    from core import urls
    fs, path = urls.resolve(run_url)
    for key in fs.find(path):
        rel = key[len(path):].lstrip("/")
        os.makedirs(os.path.dirname(os.path.join(out, rel)), exist_ok=True)
        with open(os.path.join(out, rel), "wb") as f:
            f.write(fs.cat_file(key))


def watch(run_url: str) -> None:
    """Print ``{"log": replay log version, "checkpoint": latest complete step, "metrics_bytes": ...}`` on change."""
    from core import urls
    from core.checkpoint import Checkpointer
    fs, path = urls.resolve(urls.join(run_url, "replay", "log"))
    metrics = f"{urls.resolve(run_url)[1]}/metrics.jsonl"
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
            size = fs.size(metrics) if fs.exists(metrics) else 0
        except (FileNotFoundError, OSError):
            log, step, size = 0, None, 0
        if (log, step, size) != last:
            print(json.dumps({"log": log, "checkpoint": step, "metrics_bytes": size, "time": time.time()}), flush=True)
            last = (log, step, size)
        time.sleep(0.2)


if __name__ == "__main__":
    {"serve": serve, "watch": watch, "copy": copy}[sys.argv[1]](*sys.argv[2:])
