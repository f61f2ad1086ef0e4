"""Module-level rank functions for the multi-rank checkpoint tests (spawned ranks import them)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.load import CheckpointError, load_checkpoint
from hpcrl.ckpt.state import RunState, restore_rng
from tests.ckpt._model import expected_local, global_tensors, rank_shards, rank_specs


def save_then_reshard_load(
    rank: int, world_size: int, root: str, save_tp: tuple[int, int], loads: list[tuple[int, int, int]]
) -> dict:
    """Save under (t, p) = save_tp with all ranks; then load under each (t, p, d) of `loads` with the
    first t*p*d ranks (a real subgroup). Returns, per load layout: tensors bitwise equal, bytes read,
    the rank's new shard bytes, and whether the restored RNG continues the saved stream."""
    t, p = save_tp
    tensors = global_tensors(seed=7)
    torch.manual_seed(100 + rank)
    ck = Checkpointer(root, group=dist.group.WORLD, async_save=False)
    state = RunState(step=5, data_cursor={"epoch": 0, "index": 40}, run_id="run-7")
    ck.save(5, rank_shards(tensors, rank, t, p), state, layout={"t": t, "p": p, "d": world_size // (t * p)})
    next_draw = torch.rand(3)
    results = {}
    for lt, lp, ld in loads:
        n = lt * lp * ld
        sub = dist.new_group(list(range(n)))  # every rank takes part in creating every group
        if rank >= n:
            continue
        specs = rank_specs(tensors, rank, lt, lp)
        loaded = load_checkpoint(root, specs, group=sub, expect_run_id="run-7")
        restore_rng(loaded.rng)
        results[(lt, lp, ld)] = {
            "equal": all(torch.equal(loaded.tensors[s.name], expected_local(tensors, s)) for s in specs),
            "bytes_read": loaded.bytes_read,
            "shard_bytes": sum(s.nbytes for s in specs),
            "rng_continues": torch.equal(torch.rand(3), next_draw),
            "cursor": loaded.state.data_cursor,
        }
    return results


def fallback_when_one_rank_sees_corruption(rank: int, world_size: int, root: str) -> dict:
    """2 ranks save steps 1 and 2 (t=2); rank 0 flips a byte of rank 1's file of step 2, which only
    rank 1 reads. Both ranks must agree: without fallback both raise; with fallback both load step 1."""
    group = dist.group.WORLD
    ck = Checkpointer(root, group=group, keep_last=3, async_save=False)
    for step in (1, 2):
        ck.save(step, rank_shards(global_tensors(seed=step), rank, 2, 1), RunState(step=step))
    if rank == 0:
        path = Path(root) / "step_00000002" / "rank_00001.h5"
        data = bytearray(path.read_bytes())
        data[-5] ^= 0x01
        path.write_bytes(bytes(data))
    dist.barrier(group)
    specs = rank_specs(global_tensors(seed=1), rank, 2, 1)
    try:
        load_checkpoint(root, specs, group=group)
        strict_error = ""
    except CheckpointError as err:
        strict_error = str(err)
    loaded = load_checkpoint(root, specs, group=group, fallback=True)
    equal = all(torch.equal(loaded.tensors[s.name], expected_local(global_tensors(seed=1), s)) for s in specs)
    return {
        "strict_error": strict_error,
        "step": loaded.state.step,
        "equal": equal,
        "skipped": loaded.skipped,
    }


def trigger_agreement(rank: int, world_size: int) -> tuple:
    """Only rank 1 gets a save request; both ranks must decide to save and stop."""
    from hpcrl.ckpt.trigger import SaveTrigger

    trigger = SaveTrigger(every_steps=0)
    if rank == 1:
        trigger.request()
    decision = trigger.decide(7, dist.group.WORLD)
    return decision.save, decision.stop, decision.reasons


def async_save_two_ranks(rank: int, world_size: int, root: str) -> dict:
    """Async saves on 2 ranks (t=2): tensors change in place right after each save() returns; training-like
    collectives run while the background writers work; rank 0 commits from its writer thread."""
    group = dist.group.WORLD
    ck = Checkpointer(root, group=group, async_save=True, keep_last=3)
    live = rank_shards(global_tensors(seed=1), rank, 2, 1)
    for step in (1, 2):
        for s, fresh in zip(live, rank_shards(global_tensors(seed=step), rank, 2, 1), strict=True):
            s.data.copy_(fresh.data)
        ck.save(step, live, RunState(step=step))
        ck.fence()
        for s in live:
            s.data.add_(1.0)  # the next optimizer step, while the save is in flight
        total = torch.ones(1)
        dist.all_reduce(total, group=group)  # a training collective beside the background write
    ck.save(3, live, RunState(step=3))
    if rank == 1:
        live[0].data.add_(1.0)  # no fence on rank 1: its file fails, so rank 0 never commits step 3
    try:
        ck.close()
        error = ""
    except CheckpointError as err:
        error = str(err)
    dist.barrier(group)
    out = {"error": error, "written": live[0].name}
    for step in (1, 2):
        specs = rank_specs(global_tensors(seed=step), rank, 2, 1)
        loaded = load_checkpoint(f"{root}/step_{step:08d}", specs, group=group)
        out[step] = all(
            torch.equal(loaded.tensors[s.name], expected_local(global_tensors(seed=step), s)) for s in specs
        )
    return out


def nccl_save_collectives(rank: int, world: int) -> tuple[bool, int, list]:
    """The save path's collectives on the NCCL default group (the GPU jobs' group): the trigger's vote,
    max_over_ranks and all_gather_json, each with tensors on the group's device."""
    import torch
    import torch.distributed as dist

    from hpcrl.ckpt.trigger import SaveTrigger
    from hpcrl.distributed.collectives import all_gather_json, max_over_ranks

    torch.cuda.set_device(rank % torch.cuda.device_count())
    group = dist.group.WORLD
    decision = SaveTrigger(every_steps=2).decide(2, group)
    return decision.save, max_over_ranks(rank + 5, group), all_gather_json({"rank": rank}, group)
