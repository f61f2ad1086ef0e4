"""Module-level rank functions for the cross-pool transfer tests (spawned ranks import them by name)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.reshard.cross_pool import plan_cross_pool
from hpcrl.reshard.cross_pool_transfer import FAMILY, CrossPoolTransfer
from hpcrl.reshard.params import gpt_param_metas, shard_of
from hpcrl.reshard.transport import CountingTransport, TorchTransport
from tests.reshard._rank_fns import model_dims
from tests.reshard._strategies import full_model

Case = tuple[ParallelLayout, list[int], ParallelLayout, list[int]]
"""(training layout, its global ranks, generation layout, its global ranks)."""


def transfer_cases_rank(rank: int, world: int, cases: list[Case], rounds: int) -> list[dict | None]:
    """Every case in turn on this rank (None where it is in neither pool); see `transfer_rank`."""
    out = [transfer_rank(rank, *case, rounds) for case in cases]
    dist.barrier()
    return out


def transfer_rank(
    rank: int,
    train: ParallelLayout,
    train_ranks: list[int],
    gen: ParallelLayout,
    gen_ranks: list[int],
    rounds: int,
) -> dict | None:
    """`rounds` transfers of a tiny GPT's random weights (a new version each round) through a real
    CrossPoolTransfer; this rank's verdicts (names whose tensors differ from shard_of) and counted bytes."""
    metas = gpt_param_metas(model_dims(), pipeline=train.pipeline)
    plan = plan_cross_pool(metas, train=train, train_ranks=train_ranks, gen=gen, gen_ranks=gen_ranks)
    transport = CountingTransport(TorchTransport())
    xfer = CrossPoolTransfer.build(plan, rank, transport, timeout_s=60)
    if xfer is None:
        return None
    out: dict = {
        "rank": rank,
        "sender": plan.is_sender(rank),
        "bound": plan.bytes_bound(4, rank),
        "moved": [],
    }
    out["wrong"], out["names"] = [], []
    received = xfer.allocate(torch.float32) if plan.is_receiver(rank) else {}
    for version in range(rounds):
        full = full_model(metas, dtype=torch.float32, seed=100 + version)
        if plan.is_sender(rank):
            tp, pp, _ = train.train_coords(train_ranks.index(rank))
            params = {
                m.name: shard_of(full[m.name], m, tp, train.tensor).clone() for m in metas if m.stage == pp
            }
            out["moved"].append(xfer.send(params))
            continue
        for tensor in received.values():
            tensor.fill_(float("nan"))
        out["moved"].append(xfer.receive(received))
        gtp = gen.rollout_coords(gen_ranks.index(rank)).tensor
        for meta in metas:
            if meta.name in received:
                want = shard_of(full[meta.name], meta, gtp, gen.rollout_tensor)
                if not torch.equal(received[meta.name], want):
                    out["wrong"].append((version, meta.name))
        out["names"] = list(received)
    tally = transport.total(FAMILY)
    out.update(sent=tally.bytes_sent, received=tally.bytes_received, calls=tally.calls)
    return out


def silent_sender_rank(rank: int, world: int) -> None:
    """t=1 (rank 0) -> t_g=1 (rank 1) with a 3 s timeout: the sender dies instead of sending (the injected
    fault), so the receiver's transfer must fail naming the cross-pool group, not hang."""
    train, gen = ParallelLayout(), ParallelLayout()
    plan = plan_cross_pool(
        gpt_param_metas(model_dims(num_layers=2)), train=train, train_ranks=[0], gen=gen, gen_ranks=[1]
    )
    xfer = CrossPoolTransfer.build(plan, rank, TorchTransport(timeout_s=3.0), timeout_s=3.0)
    if rank == 1:
        xfer.receive(xfer.allocate(torch.float32))
    else:
        os._exit(17)
