"""A synthetic "model + optimizer state" and hand-written shard specs for (t, p, d) layouts.

Tensors (L layers stacked on dim 0, H hidden, V vocab, F ffn):
  embedding   [V, H]      vocab-parallel: TP splits dim 0; PP/DP replicate
  qkv         [L, 3H, H]  PP splits dim 0 (layers), TP splits dim 1 (column parallel)
  fc1.gate    [L, F, H]   megatron's fused linear_fc1 = [gate_r; up_r] per TP shard is NOT one hyperslab,
  fc1.up      [L, F, H]   so it is described as two logical tensors, each TP-split on dim 1
  proj        [L, H, H]   PP dim 0, TP dim 2 (row parallel)
  norm        [L, H]      PP dim 0, replicated across TP and DP (written once)
  step_count  []          scalar, replicated everywhere
Every tensor also has optimizer state "opt.exp_avg.<name>" (fp32, sharded like the parameter);
parameters are bf16 to exercise the raw-bits path.
The split here is written by hand (not with hpcrl.ckpt.partition) so tests check that module too.
"""

from __future__ import annotations

import torch

from hpcrl.ckpt.shards import ShardedTensor, ShardSpec, dtype_name

L, H, V, F = 4, 16, 32, 24

# name -> (global shape, {axis: dim})
PARAMS: dict[str, tuple[tuple[int, ...], dict[str, int]]] = {
    "embedding": ((V, H), {"tp": 0}),
    "qkv": ((L, 3 * H, H), {"pp": 0, "tp": 1}),
    "fc1.gate": ((L, F, H), {"pp": 0, "tp": 1}),
    "fc1.up": ((L, F, H), {"pp": 0, "tp": 1}),
    "proj": ((L, H, H), {"pp": 0, "tp": 2}),
    "norm": ((L, H), {"pp": 0}),
    "step_count": ((), {}),
}


def global_tensors(seed: int) -> dict[str, torch.Tensor]:
    """Full (unsharded) parameters (bf16) and optimizer states (fp32) for `seed`."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, (shape, _) in PARAMS.items():
        out[name] = torch.randn(shape, generator=gen).to(torch.bfloat16)
        out[f"opt.exp_avg.{name}"] = torch.randn(shape, generator=gen)
    return out


def partition_of(name: str) -> dict[str, int]:
    return PARAMS[name.removeprefix("opt.exp_avg.")][1]


def coords(rank: int, t: int, p: int) -> tuple[int, int, int]:
    """(tp, pp, dp) with tp fastest, then pp, then dp."""
    return rank % t, (rank // t) % p, rank // (t * p)


def box(
    name: str, shape: tuple[int, ...], rank: int, t: int, p: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    tp, pp, _ = coords(rank, t, p)
    offset, local = [0] * len(shape), list(shape)
    for axis, dim in partition_of(name).items():
        index, size = {"tp": (tp, t), "pp": (pp, p)}[axis]
        local[dim] = shape[dim] // size
        offset[dim] = local[dim] * index
    return tuple(offset), tuple(local)


def local_slice(full: torch.Tensor, offset: tuple[int, ...], local: tuple[int, ...]) -> torch.Tensor:
    return full[tuple(slice(o, o + n) for o, n in zip(offset, local, strict=True))]


def rank_shards(tensors: dict[str, torch.Tensor], rank: int, t: int, p: int) -> list[ShardedTensor]:
    """This rank's shards of every tensor (copies, as a training rank would own them)."""
    shards = []
    for name, full in tensors.items():
        offset, local = box(name, tuple(full.shape), rank, t, p)
        data = local_slice(full, offset, local).clone()
        shards.append(ShardedTensor(name, data, tuple(full.shape), offset, partition_of(name)))
    return shards


def rank_specs(tensors: dict[str, torch.Tensor], rank: int, t: int, p: int) -> list[ShardSpec]:
    specs = []
    for name, full in tensors.items():
        offset, local = box(name, tuple(full.shape), rank, t, p)
        specs.append(ShardSpec(name, tuple(full.shape), offset, local, dtype_name(full.dtype)))
    return specs


def expected_local(tensors: dict[str, torch.Tensor], spec: ShardSpec) -> torch.Tensor:
    return local_slice(tensors[spec.name], spec.global_offset, spec.local_shape)
