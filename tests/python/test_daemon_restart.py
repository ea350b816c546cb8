"""A daemon restarted while a Python process holds a lease from it: the restarted daemon adopts the
lease (still running, on the same device, which nobody else gets) until the process releases it or
dies."""

import os
import signal
import time

import pytest

import orch
from conftest import python
from test_daemon import jobs, start_daemon

ONE_GPU = """[[gpu]]
name = "NVIDIA H100 80GB HBM3"
memory_total = "80GiB"
utilization = 0
uuid = "GPU-00000000-0000-4000-8000-00000000000a"
"""

# Takes one device, then releases it when the file `release` appears and exits when `exit` does.
HOLDER = """
import os, sys, time, orch
lease = orch.use(gpus=1)
print("OK", lease.job_id, ",".join(lease.uuids), flush=True)
def wait_for(name):
    path = os.path.join({folder!r}, name)
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
wait_for("release")
if os.path.exists(os.path.join({folder!r}, "release")) and {release!r}:
    print("RELEASED", lease.release(), flush=True)
wait_for("exit")
"""


@pytest.fixture
def one_gpu(machine, tmp_path):
    """The daemon's inventory: a single idle GPU, so any second lease is no fit."""
    sim = tmp_path / "one-gpu.toml"
    sim.write_text(ONE_GPU)
    os.environ["ORCH_DEVICES"] = f"sim:{sim}"
    return machine


def job(binary, job_id, *args):
    return {j["id"]: j for j in jobs(binary, *args)}.get(job_id)


def until(check, seconds=15):
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def restart(machine, proc, sig):
    """Stops the daemon with `sig` and starts another on the same state folder; a socket a killed
    daemon left behind is removed first, so the start waits for the new one to listen."""
    proc.send_signal(sig)
    proc.wait(timeout=30)
    (machine / "orch.sock").unlink(missing_ok=True)
    return start_daemon(machine)


def test_a_lease_held_through_a_daemon_restart_is_adopted_until_released(one_gpu, tmp_path):
    binary, daemon = start_daemon(one_gpu)
    holder = python(HOLDER.format(folder=str(tmp_path), release=True))
    try:
        line = holder.stdout.readline().split()
        assert line and line[0] == "OK", holder.stderr.read()
        job_id, uuid = line[1], line[2]
        before = job(binary, job_id)
        assert before["state"] == "running" and before["devices"] == [uuid], before

        # Killed outright, then stopped politely: each time the new daemon finds the lease.
        for sig in (signal.SIGKILL, signal.SIGTERM):
            binary, daemon = restart(one_gpu, daemon, sig)
            assert holder.poll() is None, "the holder died with the daemon"
            after = job(binary, job_id)
            assert after is not None, f"after {sig.name} the lease's job is gone: {jobs(binary, '--all')}"
            assert after["state"] == "running", after
            assert after["devices"] == [uuid], after
            assert after["lease_id"] == before["lease_id"], after
            with pytest.raises(orch.NoFit, match="pass wait=True"):
                orch.lease(gpus=1)
            assert [j["id"] for j in jobs(binary)] == [job_id]

        # The holder releases through the restarted daemon: its device is free again.
        (tmp_path / "release").touch()
        released = holder.stdout.readline().split()
        assert released == ["RELEASED", "True"], (released, holder.stderr.read())
        ended = job(binary, job_id, "--all")
        assert ended["state"] == "succeeded", ended
        lease = orch.lease(gpus=1)
        assert lease.uuids == [uuid]
        lease.release()
    finally:
        (tmp_path / "release").touch()
        (tmp_path / "exit").touch()
        holder.wait(timeout=30)
        daemon.kill()
        daemon.wait()


def test_a_holder_killed_after_a_daemon_restart_frees_its_device(one_gpu, tmp_path):
    binary, daemon = start_daemon(one_gpu)
    holder = python(HOLDER.format(folder=str(tmp_path), release=False))
    try:
        line = holder.stdout.readline().split()
        assert line and line[0] == "OK", holder.stderr.read()
        job_id = line[1]
        binary, daemon = restart(one_gpu, daemon, signal.SIGKILL)
        assert job(binary, job_id)["state"] == "running"
        with pytest.raises(orch.NoFit):
            orch.lease(gpus=1)
        # Killed, it releases nothing: the restarted daemon sees its process gone and frees
        # the device.
        holder.kill()
        holder.wait(timeout=30)
        ended = until(lambda: (j := job(binary, job_id, "--all"))["state"] != "running" and j)
        assert ended and ended["state"] == "succeeded", ended
        assert f"pid {holder.pid}" in ended["reason"], ended
        assert len(orch.lease(gpus=1).devices) == 1
    finally:
        (tmp_path / "exit").touch()
        holder.wait(timeout=30)
        daemon.kill()
        daemon.wait()
