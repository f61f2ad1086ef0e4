"""Memory capacities a plan is checked against: one accelerator of the cluster profile, host RAM per rank.

GPU type comes from `cluster.gres` (gpu:<type>:N) or `cluster.constraint`; an unknown or unnamed GPU is
taken as an A100 80GB (the a100-ib profile's GPU). Host RAM per rank = `cluster.mem_gb` / tasks_per_node
when set, else this machine's physical RAM / tasks_per_node (a local run).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from hpcrl.experiment.rules import gpus_per_node

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig

GIB = 1024**3
# Nominal memory of one device, GiB (vendor datasheets); read-only, like every module-level table.
GPU_MEMORY_GIB = MappingProxyType(
    {
        "a100": 80,
        "a100-40": 40,
        "a100_40g": 40,
        "h100": 80,
        "h200": 141,
        "v100": 32,
        "l40s": 48,
        "a10": 24,
    }
)
DEFAULT_GPU = "a100"


@dataclass(frozen=True)
class Capacity:
    kind: str
    """gpu or cpu (host RAM)."""
    name: str
    bytes: float


def host_ram_bytes() -> float:
    """This machine's physical RAM."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def gpu_type(cfg: ExperimentConfig) -> str:
    """The GPU name in gres (gpu:a100:8) or constraint (a100&ib), else the default."""
    cl = cfg.cluster
    if cl.gres:
        match = re.search(r"gpu:([A-Za-z][\w-]*):\d+", cl.gres)
        if match and match.group(1).lower() in GPU_MEMORY_GIB:
            return match.group(1).lower()
    for word in re.split(r"[&|,\s]+", (cl.constraint or "").lower()):
        if word in GPU_MEMORY_GIB:
            return word
    return DEFAULT_GPU


def device_capacity(cfg: ExperimentConfig, *, host_bytes: float | None = None) -> tuple[Capacity, Capacity]:
    """(device, host) capacity per rank. A job without GPUs computes in host RAM (device = host)."""
    tasks = max(1, cfg.cluster.tasks_per_node)
    if cfg.cluster.mem_gb:
        host = Capacity(
            "cpu", f"host RAM ({cfg.cluster.mem_gb:g} GB/node / {tasks})", cfg.cluster.mem_gb * 1e9 / tasks
        )
    else:
        total = host_ram_bytes() if host_bytes is None else host_bytes
        host = Capacity("cpu", f"host RAM ({total / GIB:.0f} GiB / {tasks})", total / tasks)
    if gpus_per_node(cfg) == 0:
        return host, host
    name = gpu_type(cfg)
    return Capacity("gpu", f"{name.upper()} {GPU_MEMORY_GIB[name]}GB", GPU_MEMORY_GIB[name] * GIB), host
