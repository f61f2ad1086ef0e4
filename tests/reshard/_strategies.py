"""Hypothesis strategies and an independent reference slicer for the reshard tests."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.reshard.params import ParamMeta, Split


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@st.composite
def layouts(draw, max_world: int = 16) -> ParallelLayout:
    t = draw(st.sampled_from([k for k in (1, 2, 4, 8) if k <= max_world]))
    p = draw(st.sampled_from([k for k in (1, 2, 4) if t * k <= max_world]))
    d = draw(st.sampled_from([k for k in (1, 2) if t * p * k <= max_world]))
    return ParallelLayout(
        tensor=t,
        pipeline=p,
        data=d,
        rollout_tensor=draw(st.sampled_from(divisors(t))),
        rollout_pipeline=draw(st.sampled_from(divisors(p))),
    )


@st.composite
def metas_for(draw, layout: ParallelLayout) -> list[ParamMeta]:
    """A random model: every split kind, random shapes that divide by t, random stages."""
    t = layout.tensor
    metas = []
    for i in range(draw(st.integers(1, 7))):
        split = draw(st.sampled_from(list(Split)))
        stage = draw(st.integers(0, layout.pipeline - 1))
        cols = draw(st.integers(1, 3))
        k = draw(st.integers(1, 2))
        groups = 0
        if split is Split.REPLICATED:
            shape = (draw(st.integers(1, 5)),) if draw(st.booleans()) else (draw(st.integers(1, 3)), cols)
        elif split is Split.ROW:
            shape = (draw(st.integers(1, 3)), t * k)
        elif split is Split.GATE_UP:
            shape = (2 * t * k, cols)
        elif split is Split.QKV:
            # whole groups per generation shard; training may cut groups (t % groups == 0, megatron allows)
            groups = draw(
                st.sampled_from([g for g in divisors(t) if g % layout.rollout_tensor == 0] + [t * k])
            )
            rows = (groups * draw(st.integers(1, 3)) * t) // math.gcd(groups, t)
            shape = (rows, cols) if draw(st.booleans()) else (rows,)
        else:
            shape = (t * k, cols) if draw(st.booleans()) else (t * k,)
        dtype = draw(st.sampled_from(["float64", "float32", "bfloat16"]))  # mixed precision: dtype streams
        metas.append(ParamMeta(f"p{i}.{split.value}", shape, split, stage, groups, dtype))
    return metas


def reference_shard(full: torch.Tensor, split: Split, index: int, count: int) -> torch.Tensor:
    """Megatron's TP slicing, written out with explicit index ranges (independent of hpcrl's helpers)."""
    if split is Split.REPLICATED:
        return full
    if split is Split.ROW:
        n = full.shape[1] // count
        return full[:, index * n : (index + 1) * n]
    if split is Split.GATE_UP:
        half = full.shape[0] // 2
        n = half // count
        return torch.cat([full[index * n : (index + 1) * n], full[half + index * n : half + (index + 1) * n]])
    n = full.shape[0] // count
    return full[index * n : (index + 1) * n]


def full_model(
    metas: list[ParamMeta], dtype=torch.float64, seed: int | None = None
) -> dict[str, torch.Tensor]:
    """Distinct values for every element of the model (element ids, or random values with a seed), all
    of `dtype`, or (dtype None) each of its meta's own dtype."""
    out, base = {}, 0
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    for meta in metas:
        kind = dtype or getattr(torch, meta.dtype)
        if gen is None:
            out[meta.name] = (torch.arange(meta.numel, dtype=kind) + base).view(meta.shape)
        else:
            out[meta.name] = torch.randn(meta.shape, generator=gen, dtype=torch.float64).to(kind)
        base += meta.numel
    return out
