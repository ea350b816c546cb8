"""`apply()`: the CUDA environment of `orch run`, and a refusal once CUDA is initialised."""

import os
import subprocess
import sys

import pytest

import orch
from conftest import need_torch


def test_apply_sets_uuids_and_pci_order():
    lease = orch.lease(gpus=2)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert lease.apply() is lease
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(lease.uuids)
    assert all(u.startswith("GPU-") for u in lease.uuids)
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert os.environ["ORCH_JOB_ID"] == lease.id
    # orch itself now numbers devices as CUDA will: the lease's devices are cuda:0 and cuda:1.
    seen = {d.uuid: d.cuda_index for d in orch.devices() if d.cuda_index is not None}
    assert seen == {lease.uuids[0]: 0, lease.uuids[1]: 1}


def test_a_simulated_initialised_cuda_refuses_and_use_releases(monkeypatch):
    monkeypatch.setenv("ORCH_SIMULATE_CUDA_INITIALIZED", "torch")
    with pytest.raises(orch.CudaAlreadyInitialized, match="too late: torch has already initialised CUDA") as e:
        orch.use(gpus=8)
    assert "restart the kernel" in str(e.value)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.delenv("ORCH_SIMULATE_CUDA_INITIALIZED")
    # use() gave the lease back when it could not apply it.
    orch.lease(gpus=8).release()


def test_the_check_is_a_hook_tests_can_replace(monkeypatch):
    monkeypatch.setattr(orch._cuda, "initialized_frameworks", lambda: ["jax"])
    lease = orch.lease(gpus=1)
    with pytest.raises(orch.CudaAlreadyInitialized, match="jax"):
        lease.apply()


def test_torch_on_the_cpu_does_not_count_as_cuda():
    need_torch()
    code = (
        "import torch, orch\n"
        "torch.zeros(1) + 1\n"
        "assert not torch.cuda.is_initialized()\n"
        "lease = orch.use(gpus=1)\n"
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("GPU-")


def test_torch_with_cuda_initialised_refuses(monkeypatch):
    need_torch()
    import torch

    # No GPU here: what torch.cuda.is_initialized() answers after CUDA started is simulated.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(orch.CudaAlreadyInitialized, match="torch"):
        orch.use(gpus=1)


def test_release_gives_the_environment_back(monkeypatch):
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    with orch.use(gpus=1) as lease:
        assert os.environ["CUDA_VISIBLE_DEVICES"] == lease.uuids[0]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert "ORCH_JOB_ID" not in os.environ
    assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
