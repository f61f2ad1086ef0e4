"""Save plan: which rank writes which shard, agreed by all ranks from one metadata all-gather.

Deduplication rule: shards with the same (name, offset, shape) are replicas; the lowest group rank
holding one writes it. Every rank computes the same plan from the same gathered metadata, so a bad
description raises the same ShardError on every rank (no rank is left waiting in a collective).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass

import torch.distributed as dist

from hpcrl.ckpt.manifest import ShardEntry, TensorEntry, rank_file
from hpcrl.ckpt.shards import Box, ShardedTensor, ShardError, check_tiling, check_unique_names, dtype_name
from hpcrl.distributed.collectives import all_gather_json, group_rank, group_size


@dataclass(frozen=True)
class SavePlan:
    rank: int
    world_size: int
    token: str
    """Random id of this save, shared by all ranks (names the tmp dir)."""
    tensors: dict[str, TensorEntry]
    owned: dict[str, str]
    """Dataset name in this rank's file -> tensor name (this rank writes these shards)."""


def plan_save(shards: list[ShardedTensor], group: dist.ProcessGroup | None) -> SavePlan:
    """Collective over `group`: agree on owners, files and dataset names for every shard."""
    local = [
        {
            "name": s.name,
            "global_shape": list(s.global_shape),
            "offset": list(s.global_offset),
            "shape": list(s.data.shape),
            "dtype": dtype_name(s.data.dtype),
            "partition": s.partition,
        }
        for s in shards
    ]
    gathered = all_gather_json({"shards": local, "token": uuid.uuid4().hex[:12]}, group)
    rank = group_rank(group)
    tensors, owners = assign_owners([g["shards"] for g in gathered])
    owned = {
        shard.dataset: name
        for name, tensor in tensors.items()
        for shard, owner in zip(tensor.shards, owners[name], strict=True)
        if owner == rank
    }
    return SavePlan(rank, group_size(group), gathered[0]["token"], tensors, owned)


def assign_owners(per_rank: list[list[dict]]) -> tuple[dict[str, TensorEntry], dict[str, list[int]]]:
    """Pure: per-rank shard metadata -> manifest tensor entries and the owner rank of each shard."""
    for rank, shards in enumerate(per_rank):
        check_unique_names((s["name"] for s in shards), f"rank {rank}")
    first: dict[str, dict] = {}
    boxes: dict[str, dict[Box, int]] = defaultdict(dict)
    for rank, shards in enumerate(per_rank):
        for s in shards:
            ref = first.setdefault(s["name"], {**s, "rank": rank})
            for key in ("global_shape", "dtype", "partition"):
                if s[key] != ref[key]:
                    raise ShardError(
                        f"tensor {s['name']!r}: {key} is {ref[key]} on rank {ref['rank']} but {s[key]} on rank {rank}"
                    )
            boxes[s["name"]].setdefault(Box(tuple(s["offset"]), tuple(s["shape"])), rank)
    tensors, owners = {}, {}
    next_index: dict[int, int] = defaultdict(int)
    for name in sorted(first):
        by_box = sorted(boxes[name].items(), key=lambda item: item[0].offset)
        check_tiling(name, tuple(first[name]["global_shape"]), [box for box, _ in by_box])
        entries = []
        for box, owner in by_box:
            entries.append(ShardEntry(box.offset, box.shape, rank_file(owner), f"s{next_index[owner]:06d}"))
            next_index[owner] += 1
        tensors[name] = TensorEntry(
            tuple(first[name]["global_shape"]), first[name]["dtype"], dict(first[name]["partition"]), entries
        )
        owners[name] = [owner for _, owner in by_box]
    return tensors, owners
