"""The daemon path: HTTP/1.1 + JSON over `orch serve`'s Unix socket, as `orch submit` speaks it.

Which daemon, and whether, as every orch client looks for it: ``ORCH_SERVER`` (a socket path)
names one, and then it must answer; else, with ``ORCH_STATE_DIR`` set, that folder's socket;
else the machine's daemon (``/run/orch/orch.sock``) when its socket exists; else the user's own
(``$XDG_RUNTIME_DIR/orch.sock``). The one found is used when a daemon answers there, and leases
are local (the lease store of the state folder) otherwise; a local lease of real GPUs that the
machine's daemon owns is refused. Inside an orch job (``ORCH_JOB_ID`` set) leases are local too:
the job's own devices are the ones to choose from. ``daemon=False`` forces the local path,
``daemon=True`` requires a daemon.
"""

from __future__ import annotations

import os

from . import _native
from ._native import BadRequest, NoFit, OrchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, Optional, Tuple


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
    path: str, method: str, url: str, body: Optional[dict] = None, timeout: float = 60.0
) -> Tuple[int, Any]:
    """One request; returns the status and the decoded JSON answer."""
    import json

    conn = _connection(path, timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, url, body=data, headers={"content-type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
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
