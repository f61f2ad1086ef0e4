"""Module-level rank functions for the spawn tests (spawned processes import them by name)."""

import torch
import torch.distributed as dist


def all_reduce_rank(rank: int, world_size: int) -> float:
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    return value.item()


def failing_rank(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("boom on rank 1")
    return rank


def group_timeouts(rank: int, world: int, timeout_s: float | None) -> list[float | None]:
    """Every dist.new_group call made by hpcrl's group builders, with the timeout (seconds) it got."""
    import torch.distributed as dist

    from hpcrl.distributed.layout import ParallelLayout, create_groups
    from hpcrl.reshard.transport import make_groups
    from hpcrl.train.model import build_generation_groups, build_train_groups

    seen: list[float | None] = []
    real = dist.new_group

    def recording(*args, **kwargs):
        timeout = kwargs.get("timeout")
        seen.append(None if timeout is None else timeout.total_seconds())
        return real(*args, **kwargs)

    dist.new_group = recording
    try:
        layout = ParallelLayout(tensor=2, pipeline=1, data=1, rollout_tensor=1)
        build_train_groups(2, 1, 1, timeout_s=timeout_s)
        build_generation_groups(layout, timeout_s=timeout_s)
        create_groups(layout, timeout_s=timeout_s)
        make_groups(layout, ("micro_data",), timeout_s=timeout_s)
    finally:
        dist.new_group = real
    return seen


def megatron_fuser_names(rank: int, world_size: int) -> list[str]:
    """What megatron-core's fusion decorators are in this rank (forked from the fork server)."""
    from megatron.core import jit
    from megatron.core.fusions import fused_bias_swiglu

    return [jit.jit_fuser.__name__, fused_bias_swiglu.jit_fuser.__name__]
