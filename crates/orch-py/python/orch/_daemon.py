"""The daemon path: HTTP/1.1 + JSON over `orch serve`'s Unix socket, as `orch submit` speaks it.

Which daemon, and whether, as every orch client looks for it: ``ORCH_SERVER`` (a socket path)
names one, and then it must answer; else, with ``ORCH_STATE_DIR`` set, that folder's socket;
else the machine's daemon (``/run/orch/orch.sock``) when its socket exists; else the user's own
(``$XDG_RUNTIME_DIR/orch.sock``). The one found is used when a daemon answers there, and leases
are local (the lease store of the state folder) otherwise; a local lease of real GPUs that the
machine's daemon owns is refused. Inside an orch job (``ORCH_JOB_ID`` set) leases are local too:
the job's own devices are the ones to choose from. ``daemon=False`` forces the local path,
``daemon=True`` requires a daemon.

Each request waits for the daemon's answer at most ``ORCH_CLIENT_TIMEOUT`` (seconds, or a
duration such as ``2m``; 30 s by default), as the ``orch`` command does, then raises
``OrchError`` with a sentence naming the socket and what to check.
"""

from __future__ import annotations

import os

from . import _native
from ._native import BadRequest, NoFit, OrchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, Optional, Tuple


#: How long a request waits for the daemon's answer when ORCH_CLIENT_TIMEOUT says nothing.
DEFAULT_TIMEOUT = 30.0

_UNITS = {
    "ns": 1e-9, "nsec": 1e-9,
    "us": 1e-6, "usec": 1e-6,
    "ms": 1e-3, "msec": 1e-3,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
    "w": 604800.0, "week": 604800.0, "weeks": 604800.0,
}  # fmt: skip


def parse_duration(text: str) -> Optional[float]:
    """Seconds in `text`: a number of seconds (``30``, ``0.5``) or a duration (``2m``,
    ``1h 30m``, ``250ms``), as the orch command reads ORCH_CLIENT_TIMEOUT; None when it is
    neither, or not above zero."""
    import math
    import re

    t = text.strip()
    try:
        seconds = float(t)
    except ValueError:
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*", t)
        if not parts or "".join(f"{n}{u}" for n, u in parts) != re.sub(r"\s+", "", t):
            return None
        if any(u not in _UNITS for _, u in parts):
            return None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if math.isnan(seconds) or math.isinf(seconds) or seconds <= 0:
        return None
    return seconds


def answer_timeout() -> float:
    """How long a request waits for the daemon's answer: ORCH_CLIENT_TIMEOUT, else 30 s."""
    text = os.environ.get("ORCH_CLIENT_TIMEOUT", "")
    if not text.strip():
        return DEFAULT_TIMEOUT
    seconds = parse_duration(text)
    if seconds is None:
        raise BadRequest(
            f"ORCH_CLIENT_TIMEOUT={text} is not a duration: give seconds such as 30, or a duration such as 2m"
        )
    return seconds


def _shown(seconds: float) -> str:
    """`seconds` as the orch command shows a duration: 30s, 2m 30s, 500ms."""
    ms = round(seconds * 1000)
    shown = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            shown.append(f"{ms // size}{unit}")
            ms %= size
    return " ".join(shown) or "0s"


def _connection(path: str, timeout: float) -> Any:
    """An HTTP connection over the Unix socket `path`. http.client is imported here, on the
    daemon path only: `import orch` stays cheap."""
    import http.client
    import socket

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            sock.connect(path)
            self.sock = sock

    return UnixConnection("orch", timeout=timeout)


def _answers(path: str) -> bool:
    if not os.path.exists(path):
        return False
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(path)
        return True
    except OSError:
        return False
    finally:
        sock.close()


def socket_for(daemon: Optional[bool], own_leases: Iterable[str] = ()) -> Optional[str]:
    """The daemon's socket to use, or None for the local path. `own_leases`: the ids of the
    leases this process holds (its own `apply()` sets ORCH_JOB_ID to one of them)."""
    if daemon is False:
        return None
    # Inside an orch job (`orch run`, a daemon's job) the process already runs on its job's
    # devices: it claims among them, inside the job's lease, as `orch run` inside a job does.
    job = os.environ.get("ORCH_JOB_ID", "")
    if daemon is None and job and job not in set(own_leases):
        return None
    named = os.environ.get("ORCH_SERVER", "").strip()
    if named.startswith(("http://", "https://")):
        raise BadRequest(
            f"ORCH_SERVER={named}: this orch reaches its daemon through a Unix socket only; give the socket's path"
        )
    if named:
        return named
    found, _how = _native.find_daemon()
    if _answers(found):
        return found
    if daemon:
        raise OrchError(
            f"no orch daemon answers at {found}: start one with `orch serve`, or set ORCH_SERVER to its socket"
        )
    return None


def call(
    path: str, method: str, url: str, body: Optional[dict] = None, timeout: Optional[float] = None
) -> Tuple[int, Any]:
    """One request; returns the status and the decoded JSON answer. `timeout`: how long the
    daemon may stay silent ([`answer_timeout`] when None)."""
    import json
    import socket

    if timeout is None:
        timeout = answer_timeout()
    conn = _connection(path, timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, url, body=data, headers={"content-type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
    except socket.timeout:
        raise OrchError(
            f"the orch daemon at {path} did not answer within {_shown(timeout)} (ORCH_CLIENT_TIMEOUT): check that it is running and not stopped or overloaded (`systemctl status orch` and `journalctl -u orch` for the machine's daemon, else its log and `ps`), or set ORCH_CLIENT_TIMEOUT to wait longer"
        ) from None
    except OSError as e:
        raise OrchError(
            f"no orch daemon answers at {path} ({e}): start one with `orch serve`, or set ORCH_SERVER to its socket"
        ) from None
    finally:
        conn.close()
    try:
        answer = json.loads(raw) if raw else None
    except ValueError:
        answer = {"error": raw.decode(errors="replace")}
    return response.status, answer


def error_for(status: int, answer: Any) -> OrchError:
    """The exception for an error answer, with the daemon's sentence."""
    message = answer.get("error") if isinstance(answer, dict) else None
    message = message or f"the daemon answered {status}"
    if status == 409:
        return NoFit(message)
    if status in (400, 404):
        return BadRequest(message)
    return OrchError(message)
