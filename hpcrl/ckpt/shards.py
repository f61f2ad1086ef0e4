"""Shard descriptions: which hyperslab of which named global tensor a rank holds.

The checkpoint format is generic: a caller (the training side) describes its parameters and optimizer
state as `ShardedTensor`s — a local tensor that is the hyperslab
``global[offset[0]:offset[0]+shape[0], offset[1]:..., ...]`` of a named global tensor (megatron-core's
`dist_checkpointing.mapping.ShardedTensor` without the fragmentation bookkeeping).

Contract for callers:
- A shard must be ONE hyperslab of its global tensor. A fused tensor whose TP shard is not one hyperslab
  is described as several logical tensors. Example: megatron's `linear_fc1` TP shard is
  ``[gate_r; up_r]`` (docs/FACTS.md, parity), so it is described as two tensors ``...linear_fc1.gate`` and
  ``...linear_fc1.up``, each split on dim 0 by TP; the caller slices its local tensor into the two views.
- Replicas: two ranks holding the same (name, offset, shape) hold replicas (e.g. a norm weight on every
  TP rank, every parameter on every DP rank). It is written ONCE, by the lowest global rank holding it.
  Replicas are assumed equal; the checkpoint cannot tell which replica is right if they differ.
- Shards of one tensor may not partially overlap, and together they must cover the whole tensor.
- `partition` (optional) says which tensor dim each parallel axis splits ({"tp": 0, "pp": 1, "dp": 2});
  it is stored in the manifest so `hpcrl ckpt check --layout t=..,p=..,d=..` can derive the shards of
  another layout without the model. Axes not named replicate the tensor.
- Names are unique per rank: a rank holds at most one shard of each tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

PARALLEL_AXES = ("tp", "pp", "dp")

# torch dtype <-> (manifest name, numpy storage dtype). bf16/fp8 have no numpy dtype: stored as raw bits.
_DTYPES: dict[torch.dtype, tuple[str, str]] = {
    torch.float64: ("float64", "<f8"),
    torch.float32: ("float32", "<f4"),
    torch.float16: ("float16", "<f2"),
    torch.bfloat16: ("bfloat16", "<u2"),
    torch.float8_e4m3fn: ("float8_e4m3fn", "u1"),
    torch.float8_e5m2: ("float8_e5m2", "u1"),
    torch.int64: ("int64", "<i8"),
    torch.int32: ("int32", "<i4"),
    torch.int16: ("int16", "<i2"),
    torch.int8: ("int8", "i1"),
    torch.uint8: ("uint8", "u1"),
    torch.bool: ("bool", "u1"),
}
_BY_NAME = {name: (dtype, storage) for dtype, (name, storage) in _DTYPES.items()}
DTYPE_NAMES = frozenset(_BY_NAME)
"""Every dtype name a manifest may hold."""


class ShardError(ValueError):
    """Shard descriptions that cannot form a checkpoint (overlap, gap, inconsistent shapes)."""


def dtype_name(dtype: torch.dtype) -> str:
    if dtype not in _DTYPES:
        raise ShardError(f"dtype {dtype} is not supported by the checkpoint format")
    return _DTYPES[dtype][0]


def torch_dtype(name: str) -> torch.dtype:
    return _BY_NAME[name][0]


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype the HDF5 dataset uses for a manifest dtype name (little-endian)."""
    return np.dtype(_BY_NAME[name][1])


def itemsize(name: str) -> int:
    return torch.empty((), dtype=torch_dtype(name)).element_size()


@dataclass(frozen=True)
class Box:
    """A hyperslab: per-dim start offset and extent."""

    offset: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def intersect(self, other: Box) -> Box | None:
        starts = tuple(max(a, b) for a, b in zip(self.offset, other.offset, strict=True))
        stops = tuple(
            min(a + n, b + m)
            for a, n, b, m in zip(self.offset, self.shape, other.offset, other.shape, strict=True)
        )
        if any(stop <= start for start, stop in zip(starts, stops, strict=True)):
            return None
        return Box(starts, tuple(stop - start for start, stop in zip(starts, stops, strict=True)))

    def slices_within(self, outer: Box) -> tuple[slice, ...]:
        """This box as slices of `outer`'s local coordinates (self must lie inside outer)."""
        return tuple(
            slice(o - oo, o - oo + n) for o, n, oo in zip(self.offset, self.shape, outer.offset, strict=True)
        )

    def describe(self) -> str:
        return "[" + ",".join(f"{o}:{o + n}" for o, n in zip(self.offset, self.shape, strict=True)) + "]"


@dataclass(frozen=True)
class ShardSpec:
    """What a loading rank wants: the hyperslab `offset`+`shape` of tensor `name` (no data)."""

    name: str
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]
    local_shape: tuple[int, ...]
    dtype: str
    """Manifest dtype name (see `dtype_name`)."""
    partition: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def box(self) -> Box:
        return Box(self.global_offset, self.local_shape)

    @property
    def nbytes(self) -> int:
        return self.box.numel * itemsize(self.dtype)


@dataclass(frozen=True)
class ShardedTensor:
    """A local tensor that is one hyperslab of the named global tensor (see module docstring)."""

    name: str
    data: torch.Tensor
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]
    partition: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "global_shape", tuple(int(n) for n in self.global_shape))
        object.__setattr__(self, "global_offset", tuple(int(n) for n in self.global_offset))
        check_box(self.name, self.global_shape, self.global_offset, tuple(self.data.shape))
        check_partition(self.name, self.partition, len(self.global_shape))
        dtype_name(self.data.dtype)

    @property
    def spec(self) -> ShardSpec:
        return ShardSpec(
            self.name,
            self.global_shape,
            self.global_offset,
            tuple(self.data.shape),
            dtype_name(self.data.dtype),
            dict(self.partition),
        )

    @classmethod
    def whole(cls, name: str, data: torch.Tensor, partition: dict[str, int] | None = None) -> ShardedTensor:
        """A tensor every holder has in full (replicated)."""
        return cls(name, data, tuple(data.shape), (0,) * data.dim(), partition or {})


def check_box(name: str, global_shape: Sequence[int], offset: Sequence[int], shape: Sequence[int]) -> None:
    if not (len(global_shape) == len(offset) == len(shape)):
        raise ShardError(
            f"tensor {name!r}: global_shape {tuple(global_shape)}, offset {tuple(offset)} and local shape "
            f"{tuple(shape)} have different ranks"
        )
    for dim, (g, o, n) in enumerate(zip(global_shape, offset, shape, strict=True)):
        if o < 0 or n < 0 or o + n > g:
            raise ShardError(
                f"tensor {name!r}: shard [{o}:{o + n}] on dim {dim} lies outside global size {g}"
            )


def check_partition(name: str, partition: dict[str, int], ndim: int) -> None:
    for axis, dim in partition.items():
        if axis not in PARALLEL_AXES:
            raise ShardError(f"tensor {name!r}: unknown parallel axis {axis!r} (known: {PARALLEL_AXES})")
        if not 0 <= dim < ndim:
            raise ShardError(f"tensor {name!r}: axis {axis!r} splits dim {dim}, tensor has {ndim} dims")
    if len(set(partition.values())) != len(partition):
        raise ShardError(f"tensor {name!r}: two parallel axes split the same dim: {partition}")


def check_unique_names(names: Iterable[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ShardError(f"{what}: tensor {name!r} appears twice on one rank (one shard per tensor)")
        seen.add(name)


def check_tiling(name: str, global_shape: tuple[int, ...], boxes: list[Box]) -> None:
    """The (deduplicated) boxes of one tensor must not overlap and must cover it exactly once."""
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            both = a.intersect(b)
            if both is not None and both.numel > 0:
                raise ShardError(
                    f"tensor {name!r}: shards {a.describe()} and {b.describe()} overlap without being replicas"
                )
    covered = sum(b.numel for b in boxes)
    if covered != math.prod(global_shape):
        raise ShardError(
            f"tensor {name!r}: shards cover {covered} of {math.prod(global_shape)} elements of "
            f"global shape {global_shape}"
        )
