"""Whether a framework in this process has already initialised CUDA.

`CUDA_VISIBLE_DEVICES` is read once, when CUDA initialises in a process: setting it afterwards
changes nothing, and the program silently keeps using the devices it saw first. So
`Lease.apply()` refuses once that has happened. Nothing here imports a framework: each is only
asked when the program imported it already, and only whether *CUDA* was initialised (a CPU tensor
such as `torch.zeros(1)` does not count).

Tests (and anyone curious how the error reads) can simulate an initialised framework with
``ORCH_SIMULATE_CUDA_INITIALIZED=torch`` (any name), or by replacing
``orch._cuda.initialized_frameworks``.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List

#: Names a framework that "already initialised CUDA" (for tests of the refusal).
SIMULATE_ENV = "ORCH_SIMULATE_CUDA_INITIALIZED"


def _torch() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    if is_initialized is None:
        return False
    try:
        return bool(is_initialized())
    except Exception:
        return False


def _tensorflow() -> bool:
    if "tensorflow" not in sys.modules:
        return False
    # TensorFlow creates its devices (and the CUDA context) when its eager context initialises.
    context = sys.modules.get("tensorflow.python.eager.context")
    if context is None:
        return False
    try:
        ctx = context.context()
        return getattr(ctx, "_context_handle", None) is not None and bool(
            ctx.list_logical_devices("GPU")
        )
    except Exception:
        return False


def _jax() -> bool:
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None:
        return False
    backends = getattr(bridge, "_backends", None) or {}
    try:
        return any(name in ("cuda", "gpu", "rocm") for name in backends)
    except Exception:
        return False


def initialized_frameworks() -> List[str]:
    """The frameworks of this process that have initialised CUDA already."""
    found = []
    simulated = os.environ.get(SIMULATE_ENV, "").strip()
    if simulated:
        found.append(simulated)
    if _torch():
        found.append("torch")
    if _tensorflow():
        found.append("tensorflow")
    if _jax():
        found.append("jax")
    return found
