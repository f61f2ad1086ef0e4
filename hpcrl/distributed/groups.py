"""The one process-group factory: every torch.distributed group hpcrl creates goes through `new_group`.

So every collective on every group (training TP/PP/DP, generation groups, the reshard engine's
micro-DP groups) is bounded by `parallel.timeout_s`: a dead or stuck peer becomes an error naming the
timeout instead of torch's default 30-minute hang. Callers pass the job's `cfg.parallel.timeout_s`; code
without a config (tests, benchmarks) gets ParallelConfig's default, the one source of that number.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

from hpcrl.distributed.config import ParallelConfig

DEFAULT_TIMEOUT_S = ParallelConfig.timeout_s
"""ParallelConfig's default (the dataclass field's value)."""


def new_group(ranks: Sequence[int], timeout_s: float | None = None) -> dist.ProcessGroup:
    """dist.new_group over `ranks` with the collective timeout `timeout_s` (None: the config default).

    Collective over the WHOLE default group (torch's rule): every rank calls it, in the same order."""
    seconds = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    if not seconds > 0:
        raise ValueError(f"a process group's timeout must be > 0 seconds, got {seconds}")
    return dist.new_group(list(ranks), timeout=timedelta(seconds=seconds))
