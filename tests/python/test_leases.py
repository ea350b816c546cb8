"""Leases from Python processes: atomic across processes, held by the process, reclaimed when it
dies, the same errors as the CLI's."""

import os
import signal
import sys
import time

import pytest

import orch
from conftest import python

HOLD = """
import os, sys, time, orch
try:
    lease = orch.use(gpus={gpus}, exclusive=True)
except orch.NoFit as e:
    print("NOFIT", e, flush=True)
    sys.exit(0)
print("OK", ",".join(lease.uuids), os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
stop = {stop!r}
while not os.path.exists(stop):
    time.sleep(0.02)
"""


def test_twenty_processes_at_once_never_share_a_device(tmp_path):
    stop = tmp_path / "stop"
    procs = [python(HOLD.format(gpus=1, stop=str(stop))) for _ in range(20)]
    try:
        lines = [p.stdout.readline().strip() for p in procs]
    finally:
        stop.touch()
    for p in procs:
        p.wait(timeout=60)
        assert p.returncode == 0, p.stderr.read()
    ok = [line.split()[1] for line in lines if line.startswith("OK")]
    no_fit = [line for line in lines if line.startswith("NOFIT")]
    assert len(ok) + len(no_fit) == 20, lines
    assert len(ok) == 8, lines
    assert len(set(ok)) == 8, f"a device was given twice: {ok}"
    assert {d.uuid for d in orch.devices()} == set(ok)
    for line in no_fit:
        assert "pass wait=True to wait for a fit" in line, line
    # Every holder has ended: all eight are free again.
    assert len(orch.lease(gpus=8).devices) == 8


def test_the_lease_of_a_killed_process_is_reclaimed(tmp_path):
    holder = python(HOLD.format(gpus=8, stop=str(tmp_path / "never")))
    line = holder.stdout.readline()
    assert line.startswith("OK"), holder.stderr.read()
    with pytest.raises(orch.NoFit):
        orch.lease(gpus=1)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    lease = orch.lease(gpus=8)
    assert sorted(lease.uuids) == sorted(line.split()[1].split(","))


def test_release_and_with_give_the_devices_back():
    with orch.lease(gpus=8) as lease:
        assert len(lease.devices) == 8
        assert [d.index for d in lease.devices] == list(range(8))
        with pytest.raises(orch.NoFit, match="pass wait=True"):
            orch.lease(gpus=1)
    assert lease.released
    again = orch.lease(gpus=8)
    assert again.release() is True
    assert again.release() is False
    orch.lease(gpus=8).release()


def test_a_lease_nobody_keeps_is_held_for_the_process_life():
    orch.use(gpus=8)  # the result is dropped on purpose
    import gc

    gc.collect()
    with pytest.raises(orch.NoFit):
        orch.lease(gpus=1, devices=os.environ["ORCH_DEVICES"])


def test_a_forked_child_never_releases_its_parent_lease():
    lease = orch.lease(gpus=8)
    pid = os.fork()
    if pid == 0:
        # The child tries to release, runs the exit handlers and drops its copy of the lease.
        code = 0 if lease.release() is False and lease._native.release() is False else 1
        orch._release_all()
        del lease
        import gc

        gc.collect()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    with pytest.raises(orch.NoFit):
        orch.lease(gpus=1)
    lease.release()


def test_wait_takes_the_devices_once_they_are_freed(tmp_path):
    stop = tmp_path / "stop"
    holder = python(HOLD.format(gpus=8, stop=str(stop)))
    assert holder.stdout.readline().startswith("OK")
    started = time.monotonic()
    with pytest.raises(orch.NoFit, match="gave up waiting after"):
        orch.lease(gpus=1, wait=True, timeout=0.5)
    assert time.monotonic() - started < 5
    stop.touch()
    lease = orch.lease(gpus=2, wait=True, timeout="30s")
    assert len(lease.devices) == 2
    holder.wait(timeout=10)


def test_bad_requests_are_one_sentence():
    with pytest.raises(orch.BadRequest, match="gpus = 9, but this machine has 8 device"):
        orch.lease(gpus=9)
    with pytest.raises(orch.BadRequest, match="gpus must be at least 1"):
        orch.lease(gpus=0)
    with pytest.raises(orch.BadRequest, match="unknown built-in policy `nope`"):
        orch.lease(policy="nope")
    with pytest.raises(orch.BadRequest, match='found "10 parsecs"'):
        orch.lease(min_free_memory="10 parsecs")
    with pytest.raises(orch.BadRequest, match="max_utilization is a percent"):
        orch.lease(max_utilization=300)
    with pytest.raises(orch.BadRequest, match="devices= / ORCH_DEVICES"):
        orch.devices("tpu")
    with pytest.raises(orch.BadRequest, match="timeout is a number of seconds"):
        orch.lease(wait=True, timeout="soon")
    assert issubclass(orch.NoFit, orch.OrchError)
    assert issubclass(orch.PluginError, orch.OrchError)


def test_a_policy_refusal_is_no_fit_with_its_reason():
    with pytest.raises(orch.NoFit, match=r"found no fit.*200.0 GiB requested"):
        orch.lease(gpus=1, min_free_memory="200GiB")


def test_devices_show_both_numberings(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    devices = orch.devices()
    assert len(devices) == 8
    by_index = {d.index: d for d in devices}
    assert by_index[3].cuda_index == 0
    assert by_index[1].cuda_index == 1
    assert by_index[0].cuda_index is None
    assert by_index[0].processes and by_index[0].processes[0].pid == 31337
    assert by_index[0].memory_total_bytes == 80 << 30
    # A lease chooses among the visible devices only, and says their CUDA index.
    lease = orch.lease(gpus=2)
    assert sorted(d.physical_index for d in lease.devices) == [1, 3]
    assert {d.held_by for d in orch.devices() if d.index in (1, 3)} == {lease.id}


def test_plan_is_a_dry_run_with_reason_and_rejections():
    plan = orch.plan(gpus=2, policy="least-loaded")
    assert plan.policy == "least-loaded"
    assert len(plan.devices) == 2
    assert "least loaded" in plan.reason
    assert len(plan.rejected) == 6
    assert all(r.why for r in plan.rejected)
    # Nothing was placed.
    assert len(orch.lease(gpus=8).devices) == 8


MIG_BOX = """
[[gpu]]
name = "NVIDIA H100 80GB HBM3"
memory_total = "80GiB"
mig_mode = true
[[gpu.mig]]
uuid = "MIG-11111111-0000-4000-8000-000000000001"
name = "1g.10gb"
memory_total = "10GiB"
[[gpu.mig]]
uuid = "MIG-11111111-0000-4000-8000-000000000002"
name = "1g.10gb"
memory_total = "10GiB"
[[gpu]]
name = "NVIDIA H100 80GB HBM3"
memory_total = "80GiB"
"""


def test_a_process_leases_one_mig_slice_of_a_profile(tmp_path):
    box = tmp_path / "mig.toml"
    box.write_text(MIG_BOX)
    os.environ["ORCH_DEVICES"] = f"sim:{box}"
    first = orch.lease(mig="1g.10gb")
    second = orch.lease(mig="1g.10gb")
    assert all(u.startswith("MIG-") for u in first.uuids + second.uuids)
    assert set(first.uuids) != set(second.uuids), "one slice, one holder"
    with pytest.raises(orch.NoFit):
        orch.lease(mig="1g.10gb")
    # A lease of whole GPUs never gets the GPU in MIG mode.
    whole = orch.lease(gpus=1)
    assert whole.uuids[0].startswith("GPU-")
    with pytest.raises(orch.BadRequest, match="a process holds one slice"):
        orch.lease(gpus=2, mig="1g.10gb")
    with pytest.raises(orch.BadRequest, match="no MIG slice of that profile"):
        orch.lease(mig="3g.40gb")
    for held in (first, second, whole):
        held.release()
