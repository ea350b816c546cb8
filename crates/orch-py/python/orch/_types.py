"""The records orch returns, as dataclasses. Imported on first use (`orch.devices()`, a lease's
`devices`), so that `import orch` does not pay for `dataclasses`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional


@dataclass(frozen=True)
class Process:
    """A compute process on a device (NVML's reading)."""

    pid: int
    used_memory_bytes: Optional[int]


@dataclass(frozen=True)
class Device:
    """One device of the inventory. `index` is nvidia-smi's (physical, PCI order); `cuda_index`
    is the index CUDA gives it in this process (under `CUDA_VISIBLE_DEVICES`), None when hidden.
    A value the backend cannot read is None, never a guess."""

    index: int
    cuda_index: Optional[int]
    uuid: str
    name: str
    backend: str
    memory_total_bytes: Optional[int]
    memory_used_bytes: Optional[int]
    memory_free_bytes: Optional[int]
    utilization_gpu_percent: Optional[int]
    utilization_memory_percent: Optional[int]
    temperature_c: Optional[int]
    power_draw_w: Optional[float]
    compute_capability: Optional[str]
    pci_bus_id: Optional[str]
    processes: Optional[List[Process]]
    foreign_processes: List[Process]
    held_by: Optional[str]


@dataclass(frozen=True)
class LeasedDevice:
    """A device of a lease. `index` is its CUDA index once the lease is applied (0..n-1 in the
    lease's order); `cuda_index` the one it had when it was chosen; `physical_index` nvidia-smi's."""

    index: int
    cuda_index: int
    physical_index: int
    uuid: str
    name: str
    memory_total_bytes: Optional[int] = None
    memory_free_bytes: Optional[int] = None
    utilization_gpu_percent: Optional[int] = None


@dataclass(frozen=True)
class Rejection:
    """A visible device the policy did not choose, and why."""

    cuda_index: int
    physical_index: int
    why: str


@dataclass(frozen=True)
class Plan:
    """A dry run: what the policy would pick now, its reason, and why not the others."""

    policy: str
    devices: List[LeasedDevice]
    reason: str
    rejected: List[Rejection]
    hidden: int


def _leased(rows: List[dict]) -> List[LeasedDevice]:
    return [
        LeasedDevice(
            index=i,
            cuda_index=d["index"],
            physical_index=d["physical_index"],
            uuid=d["uuid"],
            name=d.get("name", ""),
            memory_total_bytes=d.get("memory_total_bytes"),
            memory_free_bytes=d.get("memory_free_bytes"),
            utilization_gpu_percent=d.get("utilization_gpu_percent"),
        )
        for i, d in enumerate(rows)
    ]


def _rejections(rows: List[dict]) -> List[Rejection]:
    return [Rejection(r["index"], r["physical_index"], r["why"]) for r in rows]
