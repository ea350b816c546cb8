"""One lease authority per machine: a root daemon at the machine's socket (/run/orch/orch.sock)
serves every user's `orch submit`, `orch run` and `import orch`, found without ORCH_SERVER, and
no two of them ever get one GPU at the same time.

Real Unix users (useradd) and a real root daemon: root only; skipped otherwise, failed instead
under ORCH_REQUIRE_ROOT=1. The machine's socket is the machine's: the tests take it one at a time
and are skipped where a daemon of the machine already answers there.
"""

import fcntl
import json
import os
import pathlib
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MACHINE_SOCKET = pathlib.Path("/run/orch/orch.sock")
USERS = ("orchauth1", "orchauth2", "orchauth3")
# Each job appends "DEVICES START_NS END_NS" to the shared log while it holds its devices.
RECORD = 's=$(date +%s%N); sleep {hold}; e=$(date +%s%N); echo "$CUDA_VISIBLE_DEVICES $s $e" >> {log}'
PY_RECORD = """
import os, time, orch
lease = orch.use(gpus=1, wait=True)
s = time.time_ns(); time.sleep({hold}); e = time.time_ns()
with open({log!r}, "a") as f:
    f.write(f"{{os.environ['CUDA_VISIBLE_DEVICES']}} {{s}} {{e}}\\n")
lease.release()
"""


def _need_root():
    if os.geteuid() == 0:
        return
    if os.environ.get("ORCH_REQUIRE_ROOT") == "1":
        pytest.fail("the machine-daemon tests need root and ORCH_REQUIRE_ROOT=1")
    pytest.skip("needs root (a root daemon and Unix users)")


def _user(name):
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=False)
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


def _answers(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


@pytest.fixture
def machine_daemon(tmp_path):
    """A root `orch serve` on the machine's socket, tenants t0/t1/t2 of one user each, and a
    world-writable folder the users work in. Yields (start, public, users, state folder)."""
    _need_root()
    binary = os.environ.get("ORCH_BIN")
    if not binary:
        if os.environ.get("ORCH_REQUIRE_ROOT") == "1":
            pytest.fail("ORCH_BIN names no orch binary (scripts/python-tests.sh sets it)")
        pytest.skip("ORCH_BIN names no orch binary")
    MACHINE_SOCKET.parent.mkdir(parents=True, exist_ok=True)
    lock = open(MACHINE_SOCKET.parent / "test.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    if _answers(MACHINE_SOCKET):
        pytest.skip(f"a daemon of this machine already answers at {MACHINE_SOCKET}")
    users = [_user(n) for n in USERS]
    # The users work in a folder they can reach (pytest's own is root's alone).
    public = pathlib.Path(tempfile.mkdtemp(prefix="orch-authority-", dir="/tmp"))
    os.chmod(public, 0o1777)
    config = tmp_path / "serve.toml"
    config.write_text(
        'admins = ["root"]\n'
        + "".join(f'[[tenant]]\nname = "t{i}"\nusers = ["{n}"]\n' for i, n in enumerate(USERS))
    )
    procs = []

    def start(gpus):
        sim = public / f"sim{gpus}.toml"
        sim.write_text("".join(
            f'[[gpu]]\nname = "Sim"\nmemory_total = "16GiB"\n'
            f'uuid = "GPU-0000000{i}-aaaa-bbbb-cccc-000000000000"\n'
            for i in range(gpus)
        ))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "CUDA_"))}
        env.update(ORCH_STATE_DIR=str(tmp_path / "state"), ORCH_DEVICES=f"sim:{sim}")
        daemon = subprocess.Popen(
            [binary, "serve", "--config", str(config), "--socket", str(MACHINE_SOCKET)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "daemon.log", "a"),
        )
        procs.append(daemon)
        deadline = time.monotonic() + 30
        while not _answers(MACHINE_SOCKET):
            assert daemon.poll() is None, (tmp_path / "daemon.log").read_text()
            assert time.monotonic() < deadline, "the daemon never listened"
            time.sleep(0.02)
        return daemon

    try:
        yield start, public, users, tmp_path / "state"
    finally:
        for daemon in procs:
            daemon.terminate()
            daemon.wait(timeout=30)
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
        shutil.rmtree(public, ignore_errors=True)


def user_python():
    """A Python the test users may run, and the folder that holds this `orch` package: the
    venv's interpreter may live under root's home, which they cannot enter; the package is
    abi3, so the system's Python imports it."""
    import orch

    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if not system:
        if os.environ.get("ORCH_REQUIRE_ROOT") == "1":
            pytest.fail("no system python3 the test users may run, and ORCH_REQUIRE_ROOT=1")
        pytest.skip("no system python3 the test users may run")
    return system, str(pathlib.Path(orch.__file__).resolve().parents[1])


def as_user(user, argv, public, **kwargs):
    """ARGV as USER, with nothing that names a daemon or a state folder: what the user's shell
    has on a fresh login (and this orch package on the Python path)."""
    uid, gid = user
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(public),
        "LANG": "C.UTF-8",
        "PYTHONPATH": user_python()[1],
    }
    return subprocess.Popen(
        argv,
        user=uid,
        group=gid,
        extra_groups=[],
        env=env,
        cwd=public,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def shared_log(public):
    """The log every user's job appends its spans to."""
    log = public / "spans.log"
    log.touch()
    os.chmod(log, 0o666)
    return log


def finished(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def spans(log):
    """{device: [(start, end), ...]} from the shared log."""
    by_device = {}
    for line in pathlib.Path(log).read_text().splitlines():
        devices, start, end = line.split()
        for device in devices.split(","):
            by_device.setdefault(device, []).append((int(start), int(end)))
    return by_device


def assert_no_overlap(log):
    for device, ranges in spans(log).items():
        ranges.sort()
        for a, b in zip(ranges, ranges[1:]):
            assert a[1] <= b[0], f"two holders overlapped on {device}: {a} {b}"


def jobs_as_root(binary, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    out = subprocess.run(
        [binary, "jobs", "--json", *args], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_one_machine_daemon_is_every_users_lease_authority(machine_daemon):
    start, public, (first, second, _third), _state = machine_daemon
    binary = os.environ["ORCH_BIN"]
    start(2)
    log = shared_log(public)
    # The first account's submission holds both GPUs for a while.
    code, out, err = finished(as_user(first, [
        binary, "submit", "--gpus", "2", "--", "sh", "-c", RECORD.format(hold=1.5, log=log),
    ], public))
    assert code == 0, err
    job = out.strip()
    deadline = time.monotonic() + 30
    while {j["id"]: j for j in jobs_as_root(binary, "--all")}[job]["state"] != "running":
        assert time.monotonic() < deadline, "the submitted job never started"
        time.sleep(0.02)
    # Found without ORCH_SERVER: the second account's `orch run` asks the same daemon. No fit
    # now: exit 1 with the daemon's reason.
    code, _out, err = finished(as_user(second, [binary, "run", "--gpus", "1", "--", "true"], public))
    assert code == 1, err
    assert "waiting for 1 free device" in err and "add --wait" in err, err
    # With --wait, `orch run` and `orch.use(wait=True)` start only after the first job ends.
    waiting_run = as_user(second, [
        binary, "run", "--gpus", "1", "--wait", "--", "sh", "-c", RECORD.format(hold=0.2, log=log),
    ], public)
    waiting_py = as_user(second, [user_python()[0], "-c", PY_RECORD.format(hold=0.2, log=str(log))],
                         public)
    said = []
    for proc in (waiting_run, waiting_py):
        code, _out, err = finished(proc)
        assert code == 0, err
        said.append(err)
    # It says where it stands: its place among the waiting ones (the Python process waits too).
    assert re.search(r"waits in the daemon's queue \((1st|2nd) of [12] waiting\): waiting for",
                     said[0]), said[0]
    lines = log.read_text().splitlines()
    assert len(lines) == 3, lines
    first_end = int(lines[0].split()[2])
    for line in lines[1:]:
        assert int(line.split()[1]) >= first_end, f"started before the first job ended: {lines}"
    assert_no_overlap(log)
    # Every one of them was a job of the daemon, of its own user's tenant.
    everything = jobs_as_root(binary, "--all")
    assert sorted(j["user"] for j in everything) == sorted(
        [USERS[0], USERS[1], USERS[1], USERS[1]]
    ), everything
    assert all(j["state"] in ("succeeded", "cancelled") for j in everything), everything


def test_twenty_processes_of_three_users_never_share_a_gpu(machine_daemon):
    start, public, users, state = machine_daemon
    binary = os.environ["ORCH_BIN"]
    start(4)
    log = shared_log(public)
    procs = []
    for i in range(20):
        user = users[i % 3]
        kind = i % 3
        if kind == 0:
            argv = [binary, "run", "--gpus", "1", "--wait", "--timeout", "120s",
                    "--", "sh", "-c", RECORD.format(hold=0.1, log=log)]
        elif kind == 1:
            argv = ["sh", "-c", f'id=$({binary} submit --gpus 1 -- sh -c \'{RECORD.format(hold=0.1, log=log)}\') && {binary} wait "$id"']
        else:
            argv = [user_python()[0], "-c", PY_RECORD.format(hold=0.1, log=str(log))]
        procs.append(as_user(user, argv, public))
    for proc in procs:
        code, _out, err = finished(proc)
        assert code == 0, err
    lines = log.read_text().splitlines()
    assert len(lines) == 20, lines
    assert_no_overlap(log)
    # Every lease is gone at the end: no job left running, none in the daemon's lease store.
    deadline = time.monotonic() + 10
    while any(j["state"] in ("queued", "running") for j in jobs_as_root(binary, "--all")):
        assert time.monotonic() < deadline, jobs_as_root(binary, "--all")
        time.sleep(0.05)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_STATE_DIR"] = str(state)
    leases = subprocess.run([binary, "leases", "--json"], capture_output=True, text=True, env=env)
    assert leases.returncode == 0, leases.stderr
    assert json.loads(leases.stdout) == [], leases.stdout
