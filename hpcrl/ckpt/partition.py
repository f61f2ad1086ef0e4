"""Shard specs of another parallel layout, derived from the manifest's `partition` annotations.

A tensor annotated {"tp": 0, "pp": 1} is split evenly on dim 0 across the t tensor-parallel ranks and
on dim 1 across the p pipeline stages; axes it does not name replicate it. Rank order is the training
order of hpcrl.distributed.layout.ParallelLayout (tp fastest, then pp, then dp). An axis whose size does not
divide the dim is an impossible layout: `layout_problems` names the first such tensor.
"""

from __future__ import annotations

import re

from hpcrl.ckpt.manifest import Manifest
from hpcrl.ckpt.shards import ShardSpec
from hpcrl.distributed.layout import ParallelLayout

_LAYOUT = re.compile(r"^\s*t=(\d+)\s*,\s*p=(\d+)\s*,\s*d=(\d+)\s*$")


def parse_layout(text: str) -> ParallelLayout:
    """'t=2,p=1,d=2' -> ParallelLayout(tensor=2, pipeline=1, data=2)."""
    match = _LAYOUT.match(text)
    if not match:
        raise ValueError(f"layout {text!r}: expected 't=<int>,p=<int>,d=<int>'")
    t, p, d = (int(g) for g in match.groups())
    return ParallelLayout(tensor=t, pipeline=p, data=d)


def layout_problems(manifest: Manifest, layout: ParallelLayout) -> list[str]:
    """Every tensor dim that an axis of `layout` cannot split evenly (empty: the layout can load)."""
    sizes = {"tp": layout.tensor, "pp": layout.pipeline, "dp": layout.data}
    problems = []
    for name, tensor in sorted(manifest.tensors.items()):
        for axis, dim in sorted(tensor.partition.items()):
            if tensor.global_shape[dim] % sizes[axis]:
                problems.append(
                    f"tensor {name!r}: dim {dim} of size {tensor.global_shape[dim]} does not divide by "
                    f"{axis} size {sizes[axis]} (layout {layout.describe()})"
                )
    return problems


def layout_specs(manifest: Manifest, layout: ParallelLayout, rank: int) -> list[ShardSpec]:
    """The shard of every checkpoint tensor that `rank` holds under `layout`."""
    coords = layout.train_coords(rank)
    index = {"tp": coords.tensor, "pp": coords.pipeline, "dp": coords.data}
    sizes = {"tp": layout.tensor, "pp": layout.pipeline, "dp": layout.data}
    specs = []
    for name, tensor in sorted(manifest.tensors.items()):
        offset, shape = [0] * len(tensor.global_shape), list(tensor.global_shape)
        for axis, dim in tensor.partition.items():
            shape[dim] = tensor.global_shape[dim] // sizes[axis]
            offset[dim] = shape[dim] * index[axis]
        specs.append(
            ShardSpec(
                name, tensor.global_shape, tuple(offset), tuple(shape), tensor.dtype, dict(tensor.partition)
            )
        )
    return specs
