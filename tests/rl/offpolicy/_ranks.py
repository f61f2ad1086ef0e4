"""Rank functions of the async placement tests (module level, so spawned ranks can import them)."""

from __future__ import annotations

import torch

from tests.rl._job_ranks import run_named, tiny_config


def jobs_then_double_buffer(rank: int, world: int, named: list, run_root: str) -> dict:
    """The async jobs `named` one after another, then `double_buffer_ranks` and `pool_sides` of the
    first config (one world, one start-up)."""
    run_named(rank, world, named, run_root)
    return double_buffer_ranks(rank, world) | {"sides": pool_sides(rank, world, named[0][1], run_root)}


def pool_sides(rank: int, world: int, cfg, run_root: str) -> dict:
    """What this rank's async job holds: the training pool a Learner (and trainers to checkpoint), the
    rollout pool a Collector; neither a stand-in of the other half."""
    from pathlib import Path

    from hpcrl.rl.assemble import build_job

    job = build_job(cfg, Path(run_root) / "sides", rank, world)
    driver = job.driver
    out = {
        "driver": type(driver).__name__,
        "learner": type(getattr(driver, "learner", None)).__name__,
        "collector": type(getattr(driver, "collector", None)).__name__,
        "trainers": sorted(job.trainers),
        "attributes": sorted(vars(driver)),
    }
    job.logger.close()
    job.close(True)
    return out


def tiny_model_config():
    """grpo_tiny's model (a 90K-parameter Llama)."""
    return tiny_config().model


def double_buffer_ranks(rank: int, world: int) -> dict:
    """Rank 0 trains (sends versions 1 and 2 of made-up training shards), rank 1 holds the HF engine
    behind a DoubleBufferedWeights. Checks, on rank 1, that a completely received version stays in the
    back buffer (the engine keeps generating with the front) until `swap`, and what swap refuses."""
    from hpcrl.distributed.layout import ParallelLayout
    from hpcrl.reshard.cross_pool import plan_cross_pool
    from hpcrl.reshard.cross_pool_transfer import CrossPoolTransfer
    from hpcrl.reshard.params import gpt_param_metas
    from hpcrl.rl.handoff import shard_loader
    from hpcrl.rl.offpolicy.weights import DoubleBufferedWeights, WeightSender
    from hpcrl.rollout.hf_engine import HFRolloutEngine

    cfg = tiny_model_config()
    layout = ParallelLayout()
    plan = plan_cross_pool(gpt_param_metas(cfg), train=layout, train_ranks=[0], gen=layout, gen_ranks=[1])
    transfer = CrossPoolTransfer.build(plan, rank)
    versions = {
        v: {n: torch.full(s, float(v)) for n, s in plan.train_shapes(0).items()} for v in (1, 2)
    }  # version v: every element equals v
    if rank == 0:
        current = {"version": 1}
        sender = WeightSender(transfer, lambda: versions[current["version"]])
        sent = [sender.publish(1)]
        torch.distributed.barrier()  # rank 1 checked version 1 before version 2 is sent
        current["version"] = 2
        sent.append(sender.publish(2))
        return {"sent": sent}
    engine = HFRolloutEngine.from_model_config(cfg, pad_id=0, eos_id=2)
    front = next(engine.model.parameters())
    before = front.detach().clone()
    back = transfer.allocate(torch.float32)
    weights = DoubleBufferedWeights(transfer, back, shard_loader("hf", engine, layout, 0, cfg))
    out: dict = {}
    weights.start_receive(1)
    out["received_in_time"] = weights.wait_received(timeout_s=120)  # the condition, not a sleep (a guard)
    out["back_is_v1"] = all(bool((t == 1.0).all()) for t in back.values())
    out["front_unchanged_before_swap"] = torch.equal(front, before) and weights.version is None
    try:
        weights.swap(2)
    except RuntimeError as err:
        out["wrong_swap"] = str(err)
    out["swap"] = weights.swap(1)
    out["front_is_v1"] = bool((front == 1.0).all()) and weights.version == 1
    torch.distributed.barrier()
    out["swap2"] = weights.receive_now(2)
    out["front_is_v2"] = bool((front == 2.0).all()) and weights.version == 2
    weights.close()
    return out
