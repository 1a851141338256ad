"""codecarbon's CPU name from /proc/cpuinfo instead of py-cpuinfo's subprocess (core.carbon.codecarbon_meter)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from core.carbon.codecarbon_meter import proc_cpu_model

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def test_proc_cpu_model_parses_the_first_model_name(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14 96-Core Processor  \n"
                 "processor\t: 1\nmodel name\t: other\n")
    assert proc_cpu_model(str(f)) == "AMD EPYC 9B14 96-Core Processor"
    f.write_text("processor\t: 0\nCPU implementer\t: 0x41\nmodel name\t:\n")   # ARM: none, or empty
    assert proc_cpu_model(str(f)) is None
    assert proc_cpu_model(str(tmp_path / "missing")) is None


@pytest.mark.slow   # a fresh interpreter importing codecarbon: ~3.5 s loaded
def test_prime_fills_codecarbons_cache_and_restores_cpuinfo():
    pytest.importorskip("codecarbon")
    code = textwrap.dedent("""
        import cpuinfo
        from codecarbon.core import util
        from core.carbon.codecarbon_meter import prime_cpu_model
        real = cpuinfo.get_cpu_info
        assert prime_cpu_model("Test CPU 9000") is True
        assert util.detect_cpu_model() == "Test CPU 9000" and cpuinfo.get_cpu_info is real
        assert prime_cpu_model("Other") is False and util.detect_cpu_model() == "Test CPU 9000"
        assert prime_cpu_model(None) is False
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.slow   # py-cpuinfo's subprocess: ~2.5 s loaded
def test_proc_cpu_model_is_what_py_cpuinfo_reports_here():
    cpuinfo = pytest.importorskip("cpuinfo")
    model = proc_cpu_model()
    if model is None:
        pytest.skip("no model name in /proc/cpuinfo on this machine")
    assert model == cpuinfo.get_cpu_info()["brand_raw"]
