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
