"""The same calls through `orch serve`: a daemon started by the test on its own state folder."""

import json
import os
import signal
import subprocess
import time

import pytest

import orch
from conftest import LAB, python


def orch_bin():
    path = os.environ.get("ORCH_BIN")
    if not path:
        pytest.skip("ORCH_BIN is not set (scripts/python-tests.sh sets it to the built orch)")
    return path


def start_daemon(machine, *args):
    binary = orch_bin()
    socket = machine / "orch.sock"
    machine.mkdir(parents=True, exist_ok=True)
    log = open(machine / "daemon.log", "wb")
    proc = subprocess.Popen(
        [binary, "serve", *args], stdin=subprocess.DEVNULL, stdout=log, stderr=log
    )
    deadline = time.monotonic() + 30
    while not socket.exists():
        assert proc.poll() is None, (machine / "daemon.log").read_text()
        assert time.monotonic() < deadline, "the daemon never listened"
        time.sleep(0.02)
    os.environ["ORCH_SERVER"] = str(socket)
    return binary, proc


@pytest.fixture
def daemon(machine):
    """`orch serve` on the test's state folder; ORCH_SERVER names its socket."""
    binary, proc = start_daemon(machine)
    yield binary
    proc.kill()
    proc.wait()


@pytest.fixture
def limited_daemon(machine):
    """A daemon whose one tenant (this user) may hold two devices at once."""
    me = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    config = machine.parent / "serve.toml"
    config.write_text(f'[[tenant]]\nname = "lab"\nusers = ["{me}"]\nmax_gpus = 2\n')
    binary, proc = start_daemon(machine, "--config", str(config))
    yield binary
    proc.kill()
    proc.wait()


def jobs(binary, *args):
    out = subprocess.run([binary, "jobs", "--json", *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_lease_through_the_daemon_is_a_job_and_ends_on_release(daemon):
    lease = orch.use(gpus=2)
    assert lease.job_id is not None
    assert len(lease.devices) == 2
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(lease.uuids)
    assert "least loaded" in lease.reason
    running = {j["id"]: j for j in jobs(daemon)}
    assert running[lease.job_id]["state"] == "running"
    assert running[lease.job_id]["gpus"] == 2
    # Six left: more is no fit now, with the daemon's sentence.
    with pytest.raises(orch.NoFit, match="pass wait=True"):
        orch.lease(gpus=7)
    lease.release()
    ended = {j["id"]: j for j in jobs(daemon, "--all")}[lease.job_id]
    assert ended["state"] == "succeeded"
    assert len(orch.lease(gpus=8).devices) == 8


def test_bad_requests_come_back_as_bad_request(daemon):
    with pytest.raises(orch.BadRequest, match="gpus = 9"):
        orch.lease(gpus=9)
    with pytest.raises(orch.BadRequest, match="unknown built-in policy"):
        orch.lease(policy="nope")


HOLD = """
import os, sys, time, orch
lease = orch.use(gpus={gpus}, wait={wait})
print("OK", lease.job_id, ",".join(lease.uuids), flush=True)
while not os.path.exists({stop!r}):
    time.sleep(0.02)
"""


def test_the_lease_of_a_killed_process_ends_and_a_waiter_gets_it(daemon, tmp_path):
    holder = python(HOLD.format(gpus=8, wait=False, stop=str(tmp_path / "never")))
    line = holder.stdout.readline().split()
    assert line and line[0] == "OK", holder.stderr.read()
    job = line[1]
    waiter = python(HOLD.format(gpus=2, wait=True, stop=str(tmp_path / "stop")))
    time.sleep(0.5)
    assert waiter.poll() is None
    queued = [j for j in jobs(daemon) if j["state"] == "queued"]
    assert len(queued) == 1, queued
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    got = waiter.stdout.readline().split()
    assert got and got[0] == "OK", waiter.stderr.read()
    # The daemon sees the process gone within its next look (100 ms).
    deadline = time.monotonic() + 10
    while True:
        ended = {j["id"]: j for j in jobs(daemon, "--all")}[job]
        if ended["state"] != "running" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert ended["state"] == "succeeded", ended
    assert f"pid {holder.pid}" in ended["reason"]
    (tmp_path / "stop").touch()
    waiter.wait(timeout=10)


def test_twenty_processes_through_the_daemon_never_share(daemon, tmp_path):
    stop = tmp_path / "stop"
    code = """
import os, sys, time, orch
try:
    lease = orch.use(gpus=1)
except orch.NoFit as e:
    print("NOFIT", e, flush=True); sys.exit(0)
print("OK", lease.uuids[0], flush=True)
while not os.path.exists({stop!r}):
    time.sleep(0.02)
""".format(stop=str(stop))
    procs = [python(code) for _ in range(20)]
    try:
        lines = [p.stdout.readline().strip() for p in procs]
    finally:
        stop.touch()
    for p in procs:
        p.wait(timeout=60)
    ok = [line.split()[1] for line in lines if line.startswith("OK")]
    assert len(ok) == 8 and len(set(ok)) == 8, lines
    assert len([line for line in lines if line.startswith("NOFIT")]) == 12, lines


def test_without_a_daemon_the_local_store_is_used(machine):
    # No ORCH_SERVER and nothing at the default socket: local, as before.
    lease = orch.lease(gpus=1)
    assert lease.job_id is None
    with pytest.raises(orch.OrchError, match="no orch daemon answers"):
        orch.lease(gpus=1, daemon=True)


def test_a_waiter_that_gives_up_leaves_the_queue(daemon):
    held = orch.lease(gpus=8)
    with pytest.raises(orch.NoFit, match="gave up waiting after"):
        orch.lease(gpus=1, wait=True, timeout=0.5)
    assert [j for j in jobs(daemon) if j["state"] == "queued"] == []
    held.release()


def test_inside_an_orch_job_leases_are_local(daemon, monkeypatch):
    # A program started by `orch run` or the daemon chooses among its job's own devices.
    monkeypatch.setenv("ORCH_JOB_ID", "some-job")
    lease = orch.lease(gpus=1)
    assert lease.job_id is None
    assert jobs(daemon) == []


def test_the_tenants_limits_hold_for_leases(limited_daemon):
    first = orch.lease(gpus=2)
    # Six devices are free, but the tenant holds its two.
    with pytest.raises(orch.NoFit, match="max_gpus = 2"):
        orch.lease(gpus=1)
    first.release()
    assert len(orch.lease(gpus=2).devices) == 2


def test_orch_cancel_of_a_held_lease_stops_its_process(daemon, tmp_path):
    holder = python(HOLD.format(gpus=1, wait=False, stop=str(tmp_path / "never")))
    line = holder.stdout.readline().split()
    assert line and line[0] == "OK", holder.stderr.read()
    job = line[1]
    out = subprocess.run([daemon, "cancel", job], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert holder.wait(timeout=10) == -signal.SIGTERM
    deadline = time.monotonic() + 10
    while True:
        ended = {j["id"]: j for j in jobs(daemon, "--all")}[job]
        if ended["state"] != "running" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert ended["state"] == "cancelled", ended
