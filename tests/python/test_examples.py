"""The examples under examples/python run as they are, on the sim inventory and the CPU."""

import importlib.util
import os
import subprocess
import sys

import pytest

import orch
from conftest import ROOT, need_torch

EXAMPLES = ROOT / "examples" / "python"


def run(script, **env):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_ddp_on_two_leased_devices():
    need_torch()
    out = run("ddp_torch.py", STEPS="20")
    assert "leased " in out
    assert out.count("GPU-") >= 2
    assert "DDP on the CPU, 2 processes, gloo" in out
    assert "replicas agree: True" in out
    losses = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("step")]
    assert losses[-1] < losses[0], out
    # Released at the end: all eight are free.
    assert len(orch.lease(gpus=8).devices) == 8


def test_ddp_with_the_cpu_as_the_only_device():
    need_torch()
    out = run("ddp_torch.py", STEPS="5", ORCH_DEVICES="cpu")
    assert "CUDA_VISIBLE_DEVICES=\n" in out
    assert "replicas agree: True" in out


def test_the_notebook_style_script():
    need_torch()
    out = run("notebook.py")
    assert "most free memory" in out
    assert "on cpu: loss" in out
    assert "released" in out


def test_the_tensorflow_variant():
    if importlib.util.find_spec("tensorflow") is None:
        if os.environ.get("ORCH_REQUIRE_TENSORFLOW") == "1":
            pytest.fail("tensorflow is not installed and ORCH_REQUIRE_TENSORFLOW=1")
        pytest.skip("tensorflow is not installed (scripts/python-tests.sh installs tensorflow-cpu)")
    out = run("tf_keras.py")
    assert "loss" in out
