"""Fixtures for replay tests; the fakes live in replay_fakes.py (a unique module name)."""
import uuid

import pytest


@pytest.fixture(params=["memory", "local"])
def store_url(request, tmp_path):
    """A fresh store location: memory:// and a local tmp dir."""
    if request.param == "memory":
        url = f"memory://replay-tests/{uuid.uuid4().hex}"
        yield url
        import fsspec
        fsspec.filesystem("memory").rm(url.split("://", 1)[1], recursive=True)
    else:
        yield str(tmp_path / "replay")
