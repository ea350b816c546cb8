"""Fixtures of the Python package's tests: a fresh state folder and the 8-GPU sim box per test.

Run by scripts/python-tests.sh against the wheel it builds; `ORCH_REQUIRE_TORCH=1` turns the
tests that need torch from skipped into failed when it is missing, `ORCH_BIN` names the `orch`
binary the daemon tests start.
"""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB = ROOT / "examples" / "sim" / "lab-8gpu.toml"


@pytest.fixture(autouse=True)
def machine(tmp_path):
    """Every test gets its own lease store and the sim inventory; no daemon unless it starts one.
    The environment is restored afterwards: `apply()` writes to it."""
    saved = dict(os.environ)
    state = tmp_path / "state"
    os.environ["ORCH_STATE_DIR"] = str(state)
    os.environ["ORCH_DEVICES"] = f"sim:{LAB}"
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "ORCH_SERVER", "ORCH_JOB_ID",
                 "ORCH_SIMULATE_CUDA_INITIALIZED", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS",
                 "TF_FORCE_GPU_ALLOW_GROWTH", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        os.environ.pop(name, None)
    yield state
    os.environ.clear()
    os.environ.update(saved)


def python(code, **kwargs):
    """Starts `python -c CODE` with the test's environment."""
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def need_torch():
    """torch, or a skip (a failure under ORCH_REQUIRE_TORCH=1)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        if os.environ.get("ORCH_REQUIRE_TORCH") == "1":
            pytest.fail("torch is not installed and ORCH_REQUIRE_TORCH=1")
        pytest.skip("torch is not installed (scripts/python-tests.sh installs it)")
