"""Module-level rank functions for the reshard tests (spawned ranks import them by name)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.reshard.build import ENGINE_FAMILIES
from hpcrl.reshard.engine import HybridEngine
from hpcrl.reshard.naive import NaiveEngine
from hpcrl.reshard.params import gpt_param_metas, shard_of
from hpcrl.reshard.planner import REPLICATED, SPLIT, plan_rank
from hpcrl.reshard.transport import CountingTransport, Group, TorchTransport, make_groups
from tests.reshard._strategies import full_model, reference_shard


def groups_for(layout: ParallelLayout, cache: dict, timeout_s: float | None = None) -> dict[str, Group]:
    return make_groups(layout, ENGINE_FAMILIES, timeout_s=timeout_s, cache=cache)


def model_dims(**overrides) -> SimpleNamespace:
    """A tiny GPT (GQA) that every layout pair with world <= 8 can split: 8 layers, heads 16, kv heads 8."""
    dims = dict(
        vocab_size=32,
        hidden_size=32,
        num_layers=8,
        num_attention_heads=16,
        num_query_groups=8,
        ffn_hidden_size=32,
        qkv_bias=True,
        tie_word_embeddings=False,
        dtype="float32",
        norm_dtype="float32",
    )
    dims.update(overrides)
    return SimpleNamespace(**dims)


def check_pair(
    layout: ParallelLayout, groups: dict[str, Group], dims, bucket_bytes: int, device: str
) -> dict:
    """Run both engines on this rank; return equality verdicts and counted volumes."""
    rank = dist.get_rank()
    metas = dims_metas(dims, layout.pipeline)
    split_of = {m.name: m.split for m in metas}
    full = {k: v.to(device) for k, v in full_model(metas, dtype=None, seed=7).items()}
    tp, pp, _ = layout.train_coords(rank)
    g_tp = layout.rollout_coords(rank).tensor
    plan = plan_rank(layout, metas, rank, bucket_bytes=bucket_bytes)
    out = {
        "layout": layout.describe(),
        "rank": rank,
        "lower_bound": plan.lower_bound_bytes(),
        "lower_bound_split": plan.lower_bound_bytes(SPLIT),
        "streams": [s.name for s in plan.streams],
        "stream_bounds": {
            s.name: sum(n * s.itemsize for m, n in enumerate(s.lengths) if m != s.member)
            for s in plan.streams
        },
    }
    for kind in ("hybrid", "naive"):
        params = {
            m.name: shard_of(full[m.name], m, tp, layout.tensor).clone() for m in metas if m.stage == pp
        }
        before = {n: t.clone() for n, t in params.items()}
        transport = CountingTransport(TorchTransport())
        engine = (
            HybridEngine(plan, transport, groups)
            if kind == "hybrid"
            else NaiveEngine(plan, metas, transport, groups)
        )
        engine.attach(params)
        ptrs = {n: t.data_ptr() for n, t in params.items()}
        shard = engine.to_generation()
        names, wrong = [], []
        for name, tensor in shard.megatron_tensors():
            names.append(name)
            want = reference_shard(full[name], split_of[name], g_tp, layout.rollout_tensor)
            if tensor.shape != want.shape or not torch.equal(tensor, want):
                wrong.append(name)
        in_place = None
        if kind == "hybrid":  # the own pieces of the generation shard are views of the parameters
            storages = {t.untyped_storage().data_ptr() for t in params.values()}
            own = [p for g in plan.gen for p in g.pieces if p.member == plan.stream(p.stream).member]
            in_place = all(shard.piece(p).untyped_storage().data_ptr() in storages for p in own)
            received = shard.received_bytes()
            per_stream = {s.name: engine.transport.total(s.name).bytes_received for s in plan.streams}
        peak_during = engine.meter.peak
        engine.to_training(shard)
        restored = all(torch.equal(params[n], before[n]) for n in params)
        same_memory = all(params[n].data_ptr() == ptrs[n] for n in params)
        out[kind] = {
            "names": names,
            "wrong": wrong,
            "restored": restored,
            "same_memory": same_memory,
            "in_place": in_place,
            "peak": peak_during,
            "live_after": engine.meter.live,
            "split": vars(transport.total(SPLIT)),
            "replicated": vars(transport.total(REPLICATED)),
            "received_buffers": received if kind == "hybrid" else None,
            "per_stream": per_stream if kind == "hybrid" else None,
        }
    out["expected_names"] = [g.name for g in plan.gen]
    return out


def dims_metas(dims, pipeline: int):
    return gpt_param_metas(dims, pipeline=pipeline, dtype=dims.dtype, norm_dtype=dims.norm_dtype)


def reshard_pairs_rank(
    rank: int,
    world_size: int,
    pairs: list[tuple],
    bucket_bytes: int,
    device: str = "cpu",
    dims_overrides: dict | None = None,
) -> list[dict | None]:
    """Every layout pair in `pairs` (t, p, d, t_g, p_g) in turn on the first t·p·d ranks of the world."""
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    cache: dict = {}
    dims = model_dims(**(dims_overrides or {}))
    results = []
    for t, p, d, t_g, p_g in pairs:
        layout = ParallelLayout(tensor=t, pipeline=p, data=d, rollout_tensor=t_g, rollout_pipeline=p_g)
        groups = groups_for(layout, cache)
        if rank >= layout.world_size:
            results.append(None)
            continue
        results.append(check_pair(layout, groups, dims, bucket_bytes, device))
    dist.barrier()
    return results


def dying_rank(rank: int, world_size: int, mode: str = "exit") -> None:
    """Rank 1 dies (mode "exit") or hangs ("hang") after the first bucket of the reshard; its peers must
    fail naming the group, within the collective timeout."""
    layout = ParallelLayout(tensor=2, rollout_tensor=1)
    groups = groups_for(layout, {}, timeout_s=3.0)
    dims = model_dims(num_layers=2)
    metas = gpt_param_metas(dims, pipeline=1)
    full = full_model(metas, dtype=torch.float32, seed=1)
    plan = plan_rank(layout, metas, rank, bucket_bytes=1024)
    params = {m.name: shard_of(full[m.name], m, rank, 2).clone() for m in metas}

    class DieAfterFirst(TorchTransport):
        calls = 0

        def all_gather(self, output, input, group, tag=""):
            DieAfterFirst.calls += 1
            if rank == 1 and DieAfterFirst.calls == 2:
                if mode == "exit":
                    os._exit(17)
                time.sleep(60)
            super().all_gather(output, input, group, tag)

    engine = HybridEngine(plan, DieAfterFirst(timeout_s=3.0), groups)
    engine.attach(params)
    engine.to_generation()
