"""The few collectives a checkpoint save and the async batch channel need, over an explicitly passed
process group, without pickle.

`group=None` means "this process alone" (a world of one): no torch.distributed call is made.
Objects travel as UTF-8 JSON in uint8 tensors (torch's `all_gather_object` would pickle them).
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist


def group_rank(group: dist.ProcessGroup | None) -> int:
    return 0 if group is None else dist.get_rank(group)


def group_size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def collective_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where this group's collectives take their tensors: NCCL only moves CUDA tensors (a CPU tensor on a
    NCCL group raises), gloo only CPU ones. The jobs' default group is NCCL under `backend: auto` on GPUs."""
    if group is not None and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_json(obj: Any, group: dist.ProcessGroup | None) -> list[Any]:
    """Every rank's `obj`, indexed by group rank."""
    if group is None:
        return [json.loads(json.dumps(obj))]
    device = collective_device(group)
    payload = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8).to(device)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(group_size(group))]
    dist.all_gather(sizes, size, group=group)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    gathered = [torch.zeros_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded, group=group)
    return [
        json.loads(bytes(g[: int(s.item())].tolist()).decode()) for g, s in zip(gathered, sizes, strict=True)
    ]


def any_rank(flag: bool, group: dist.ProcessGroup | None) -> bool:
    """True on every rank when `flag` is True on at least one rank."""
    return bool(max_over_ranks(int(flag), group))


def max_over_ranks(value: int, group: dist.ProcessGroup | None) -> int:
    """The largest `value` over the group's ranks, on every rank."""
    if group is None:
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=collective_device(group))
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return int(tensor.item())
