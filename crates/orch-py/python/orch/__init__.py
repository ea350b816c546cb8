"""orch from inside Python: race-free GPU leases for scripts and notebooks.

    import orch
    lease = orch.use(gpus=2)          # before importing torch / tensorflow / jax
    import torch                      # sees exactly the two leased GPUs, as cuda:0 and cuda:1

The lease is claimed atomically in orch's lease store (or through `orch serve` when a daemon
runs), by the same policies and library as `orch run`, and held by this process: it ends with
`lease.release()`, the end of a `with` block, or the process (a notebook kernel keeps it until it
is restarted). See docs/PYTHON.md.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

from . import _cuda, _daemon, _native
from ._native import BadRequest, NoFit, OrchError, PluginError

# Annotations are never evaluated at run time (`from __future__ import annotations`): `typing`
# and the dataclasses (`_types`) are imported by type checkers here, and by the program only
# when it first needs a record, which keeps `import orch` cheap.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Union

    from ._types import Device, LeasedDevice, Plan, Process, Rejection

    Size = Union[int, str]
    Seconds = Union[int, float, str]

_RECORDS = ("Device", "LeasedDevice", "Plan", "Process", "Rejection")


def __getattr__(name: str) -> object:
    if name in _RECORDS:
        from . import _types

        return getattr(_types, name)
    raise AttributeError(f"module 'orch' has no attribute {name!r}")

__all__ = [
    "BadRequest",
    "CudaAlreadyInitialized",
    "Device",
    "Lease",
    "LeasedDevice",
    "NoFit",
    "OrchError",
    "Plan",
    "PluginError",
    "Process",
    "Rejection",
    "devices",
    "lease",
    "plan",
    "use",
]

class CudaAlreadyInitialized(OrchError):
    """`apply()` came after a framework initialised CUDA in this process: too late to choose devices."""


class Lease:
    """Devices held by this process. Use as a context manager, or keep it for the process's life.

    `apply()` points CUDA at them (`CUDA_VISIBLE_DEVICES` with their UUIDs,
    `CUDA_DEVICE_ORDER=PCI_BUS_ID`); `release()` gives them back."""

    def __init__(
        self,
        info: dict,
        native: Optional[_native.NativeLease] = None,
        socket: Optional[str] = None,
    ) -> None:
        self._native = native
        self._socket = socket
        self._released = False
        self._owner = os.getpid()
        self._before: Dict[str, Optional[str]] = {}
        self._info = info
        self.id: str = info.get("lease_id") or info["id"]
        #: The daemon's job id for this lease (`orch jobs`), None without a daemon.
        self.job_id: Optional[str] = info.get("job_id")
        self.policy: str = info.get("policy") or ""
        self.reason: str = info.get("reason") or ""
        self.exclusive: bool = bool(info.get("exclusive", True))
        #: The variables `apply()` sets: exactly what `orch run` gives a job on these devices.
        self.env: Dict[str, str] = dict(info.get("env", {}))

    @property
    def devices(self) -> List[LeasedDevice]:
        """The leased devices, best first."""
        from ._types import _leased

        return _leased(self._info.get("devices") or [])

    @property
    def rejected(self) -> List[Rejection]:
        """The visible devices the policy did not choose, and why."""
        from ._types import _rejections

        return _rejections(self._info.get("rejected") or [])

    @property
    def uuids(self) -> List[str]:
        return [d["uuid"] for d in self._info.get("devices") or []]

    @property
    def released(self) -> bool:
        return self._released

    def apply(self) -> "Lease":
        """Sets this process's CUDA environment to the leased devices; refuses when a framework
        has initialised CUDA already (the change would be silently ignored)."""
        if self._released:
            raise OrchError(f"lease {self.id} was released; take a new one with orch.lease()")
        frameworks = _cuda.initialized_frameworks()
        if frameworks:
            names = ", ".join(frameworks)
            raise CudaAlreadyInitialized(
                f"too late: {names} has already initialised CUDA in this process, so setting "
                "CUDA_VISIBLE_DEVICES now would be ignored and it would keep the devices it saw "
                "first; call orch.use() (or lease.apply()) before importing or initialising the "
                "framework (the top of the script, the first notebook cell), or restart the kernel "
                "and do that first"
            )
        for key, value in self.env.items():
            self._before.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        return self

    def _unapply(self) -> None:
        # The variables apply() set go back to what they were (those changed since are left).
        for key, before in self._before.items():
            if os.environ.get(key) != self.env.get(key):
                continue
            if before is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = before
        self._before.clear()

    def release(self) -> bool:
        """Gives the devices back now, and the variables `apply()` set their earlier values
        (a framework that initialised CUDA meanwhile keeps the devices it saw: stop using them).
        False when released already."""
        if self._released or os.getpid() != self._owner:
            return False
        self._released = True
        _forget(self)
        self._unapply()
        if self._native is not None:
            return bool(self._native.release())
        if self._socket is not None and self.job_id is not None:
            status, answer = _daemon.call(
                self._socket, "POST", f"/v1/leases/{self.job_id}/release"
            )
            if status >= 400:
                raise _daemon.error_for(status, answer)
        return True

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        devices = ", ".join(
            f"GPU {d['physical_index']} ({d['uuid'][:12]})" for d in self._info.get("devices") or []
        )
        state = "released" if self._released else "held"
        return f"<orch.Lease {self.id} {state}: {devices} by {self.policy}>"


# Every lease this process holds, so that `orch.use(gpus=1)` whose result is not kept still
# holds its devices for the process's life.
_held: List[Lease] = []
_held_lock = threading.Lock()


def _keep(lease: Lease) -> Lease:
    with _held_lock:
        _held.append(lease)
    return lease


def _forget(lease: Lease) -> None:
    with _held_lock:
        if lease in _held:
            _held.remove(lease)


@atexit.register
def _release_all() -> None:
    for lease in list(_held):
        try:
            lease.release()
        except Exception:
            pass  # the next reader of the store reclaims it: its holder is gone


def _spec(devices: Optional[str]) -> str:
    return devices if devices is not None else os.environ.get("ORCH_DEVICES", "auto")


def _default_name() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if not argv0 or argv0 == "-c" or "ipykernel" in argv0:
        return "python"
    return os.path.basename(argv0)


def _request(
    gpus: int,
    policy: str,
    min_free_memory: Optional[Size],
    max_utilization: Optional[int],
    memory_limit: Optional[Size],
    exclusive: bool,
    config: Optional[Mapping[str, object]],
    name: Optional[str],
    tenant: Optional[str],
    priority: int,
    mig: Optional[str] = None,
) -> dict:
    if isinstance(gpus, bool) or not isinstance(gpus, int):
        raise BadRequest(f"gpus must be a whole number of devices, found {gpus!r}")
    for key, value in (("min_free_memory", min_free_memory), ("memory_limit", memory_limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, str))):
            raise BadRequest(f'{key} is a size such as "10GiB" or a number of bytes, found {value!r}')
        if isinstance(value, int) and value < 0:
            raise BadRequest(f"{key} cannot be negative, found {value}")
    if max_utilization is not None and (
        isinstance(max_utilization, bool) or not isinstance(max_utilization, int)
    ):
        raise BadRequest(f"max_utilization is a percent from 0 to 100, found {max_utilization!r}")
    if mig is not None and not isinstance(mig, str):
        raise BadRequest(f'mig is a MIG profile such as "1g.10gb", found {mig!r}')
    pairs = [(str(k), str(v)) for k, v in (config or {}).items()]
    return (
        {
            "mig": mig,
            "name": name or _default_name(),
            "gpus": gpus,
            "policy": policy,
            "min_free_memory": min_free_memory,
            "max_utilization": max_utilization,
            "memory_limit": memory_limit,
            "exclusive": bool(exclusive),
            "config": pairs,
            "tenant": tenant,
            "priority": int(priority),
            "argv": [sys.executable, *sys.argv],
        }
    )


_DURATION = r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$"


def _seconds(timeout: Optional[Seconds]) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout >= 0:
        return float(timeout)
    import re

    match = re.match(_DURATION, timeout) if isinstance(timeout, str) else None
    if not match:
        raise BadRequest(
            f"timeout is a number of seconds or a duration such as 90s, 15m or 2h, found {timeout!r}"
        )
    scale = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[match.group(2)]
    return float(match.group(1)) * scale


def devices(devices: Optional[str] = None) -> List[Device]:
    """The inventory (`devices=` or ORCH_DEVICES: auto, nvml, cpu, sim:PATH), both numberings."""
    from ._types import Device, Process

    rows = _native.devices(_spec(devices))

    def procs(items: Optional[list]) -> Optional[List[Process]]:
        if items is None:
            return None
        return [Process(p["pid"], p.get("used_memory_bytes")) for p in items]

    return [
        Device(
            index=r["index"],
            cuda_index=r.get("cuda_index"),
            uuid=r["uuid"],
            name=r["name"],
            backend=r["backend"],
            memory_total_bytes=r.get("memory_total_bytes"),
            memory_used_bytes=r.get("memory_used_bytes"),
            memory_free_bytes=r.get("memory_free_bytes"),
            utilization_gpu_percent=r.get("utilization_gpu_percent"),
            utilization_memory_percent=r.get("utilization_memory_percent"),
            temperature_c=r.get("temperature_c"),
            power_draw_w=r.get("power_draw_w"),
            compute_capability=r.get("compute_capability"),
            pci_bus_id=r.get("pci_bus_id"),
            processes=procs(r.get("processes")),
            foreign_processes=procs(r.get("foreign_processes")) or [],
            held_by=r.get("held_by"),
        )
        for r in rows
    ]


def plan(
    gpus: int = 1,
    policy: str = "least-loaded",
    min_free_memory: Optional[Size] = None,
    max_utilization: Optional[int] = None,
    memory_limit: Optional[Size] = None,
    exclusive: bool = True,
    config: Optional[Mapping[str, object]] = None,
    devices: Optional[str] = None,
    name: Optional[str] = None,
    mig: Optional[str] = None,
) -> Plan:
    """A dry run of `lease()` on this machine: what the policy picks now and why. Places nothing."""
    request = _request(
        gpus, policy, min_free_memory, max_utilization, memory_limit, exclusive, config, name, None, 0, mig
    )
    from ._types import Plan, _leased, _rejections

    info = _native.plan(_spec(devices), request)
    return Plan(
        policy=info["policy"],
        devices=_leased(info["devices"]),
        reason=info["reason"],
        rejected=_rejections(info["rejected"]),
        hidden=info["hidden"],
    )


def lease(
    gpus: int = 1,
    policy: str = "least-loaded",
    min_free_memory: Optional[Size] = None,
    exclusive: bool = True,
    wait: bool = False,
    timeout: Optional[Seconds] = None,
    config: Optional[Mapping[str, object]] = None,
    max_utilization: Optional[int] = None,
    memory_limit: Optional[Size] = None,
    devices: Optional[str] = None,
    name: Optional[str] = None,
    tenant: Optional[str] = None,
    priority: int = 0,
    daemon: Optional[bool] = None,
    mig: Optional[str] = None,
) -> Lease:
    """Claims `gpus` devices for this process, chosen by `policy`; raises NoFit when none fit
    (or, with `wait=True`, waits for a fit, up to `timeout` seconds or for ever)."""
    request = _request(
        gpus,
        policy,
        min_free_memory,
        max_utilization,
        memory_limit,
        exclusive,
        config,
        name,
        tenant,
        priority,
        mig,
    )
    limit = _seconds(timeout)
    with _held_lock:
        own = [held.id for held in _held]
    server = _daemon.socket_for(daemon, own)
    if server is not None:
        return _keep(_lease_from_daemon(server, request, policy, wait, limit))
    spec = _spec(devices)
    started = time.monotonic()
    delay = 0.05
    while True:
        try:
            native = _native.claim(spec, request)
            return _keep(Lease(native.info, native=native))
        except NoFit as e:
            reason = str(e)
            if not wait:
                raise NoFit(f"{reason} (pass wait=True to wait for a fit)") from None
            waited = time.monotonic() - started
            if limit is not None and waited + delay > limit:
                raise NoFit(f"gave up waiting after {waited:.1f}s: {reason}") from None
        # Different in every process, so waiters do not retry in lockstep.
        import random

        time.sleep(delay + random.uniform(0, 0.05))
        delay = min(delay * 1.5, 2.0)


def _lease_from_daemon(
    server: str, request: dict, policy: str, wait: bool, limit: Optional[float]
) -> Lease:
    body: Dict[str, object] = {
        "job_text": _native.job_text(request),
        "job_path": os.path.join(os.getcwd(), "orch.lease()"),
        "cwd": os.getcwd(),
        "env": sorted(os.environ.items()),
        "wait": bool(wait),
    }
    if policy.endswith(".wasm") or os.sep in policy:
        import base64

        try:
            with open(policy, "rb") as f:
                body["policy_wasm"] = base64.b64encode(f.read()).decode()
        except OSError as e:
            raise BadRequest(f"policy={policy!r}: {e.strerror}") from None
    status, answer = _daemon.call(server, "POST", "/v1/leases", body)
    if status >= 400:
        raise _daemon.error_for(status, answer)
    job_id = answer.get("job_id")
    started = time.monotonic()
    delay = 0.05
    try:
        while answer.get("state") == "queued":
            waited = time.monotonic() - started
            if limit is not None and waited + delay > limit:
                raise NoFit(f"gave up waiting after {waited:.1f}s: {answer.get('reason', '')}")
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)
            status, answer = _daemon.call(server, "GET", f"/v1/leases/{job_id}")
            if status >= 400:
                raise _daemon.error_for(status, answer)
    except BaseException:
        # Gave up, or Ctrl-C in a notebook (the kernel lives on): the place in the queue goes
        # back, or the devices, if it started meanwhile.
        try:
            _daemon.call(server, "POST", f"/v1/leases/{job_id}/release")
        except OrchError:
            pass
        raise
    if answer.get("state") != "running":
        raise NoFit(
            f"lease job {answer.get('job_id')} ended {answer.get('state')} before it started: {answer.get('reason', '')}"
        )
    return Lease(answer, socket=server)


def use(
    gpus: int = 1,
    policy: str = "least-loaded",
    min_free_memory: Optional[Size] = None,
    exclusive: bool = True,
    wait: bool = False,
    timeout: Optional[Seconds] = None,
    config: Optional[Mapping[str, object]] = None,
    **more: object,
) -> Lease:
    """`lease(...)` and `apply()` in one line, for the top of a script or the first notebook cell.
    If the lease cannot be applied (CUDA already initialised), it is released and the error raised."""
    held = lease(
        gpus=gpus,
        policy=policy,
        min_free_memory=min_free_memory,
        exclusive=exclusive,
        wait=wait,
        timeout=timeout,
        config=config,
        **more,  # type: ignore[arg-type]
    )
    try:
        return held.apply()
    except BaseException:
        held.release()
        raise
