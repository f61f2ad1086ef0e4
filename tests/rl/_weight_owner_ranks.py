"""Rank function for tests/rl/test_weight_owner.py: a colocated RL job stepped by hand, the rollout
engine's weights compared with the trainer's after every update (module level: spawned ranks import it).
"""

from __future__ import annotations

from pathlib import Path

import torch

from hpcrl.ckpt.state import seed_rngs
from hpcrl.distributed.layout import ParallelLayout
from hpcrl.reshard.params import gpt_param_metas, shard_of
from hpcrl.rl.assemble import build_job
from hpcrl.rollout.megatron_engine import MegatronRolloutEngine
from hpcrl.train import hf_convert


def _rollout_matches_trainer(job, cfg) -> bool:
    """Whether the rollout engine holds, bit for bit, the trainer's weights as they are now. The trainer's
    side is gathered by the model code (hpcrl.train.model.gather_full_state_dict), independent of the
    reshard: the full t=1 weights, sliced to this rank's generation shard (megatron engine) or converted
    to HF names (hf engine)."""
    actor, engine = job.driver.learner.models.actor, job.driver.collector.rollout.engine
    trainer = actor.trainer
    full = trainer.full_state_dict()
    if isinstance(engine, MegatronRolloutEngine):
        p = cfg.parallel
        layout = ParallelLayout(p.tensor, p.pipeline, p.data, p.rollout_tensor, p.rollout_pipeline)
        rank = torch.distributed.get_rank()
        g_tp = layout.rollout_coords(rank).tensor
        metas = {m.name: m for m in gpt_param_metas(trainer.model_cfg)}
        held = engine.global_params()
        return all(
            torch.equal(held[name], shard_of(full[name], metas[name], g_tp, layout.rollout_tensor))
            for name in held
        )
    want = hf_convert.megatron_to_hf_state_dict(full, trainer.model_cfg)
    held = dict(engine.model.named_parameters())
    return all(torch.equal(held[name], want[name]) for name in held)


def run_and_compare(rank: int, world: int, configs: list, run_root: str, steps: int) -> dict:
    """For each (name, config): `steps` RL steps; after each, one more weight sync, then the rollout's
    weights are compared with the trainer's. Returns per name: the step metrics, whether the rollout
    matched after every update, and how far the trainer's weights moved in each update."""
    out = {}
    for name, cfg in configs:
        seed_rngs(cfg.seed)
        job = build_job(cfg, Path(run_root) / name, rank, world)
        trainer = job.driver.learner.models.actor.trainer
        metrics, matched, moved = [], [], []
        for step in range(1, steps + 1):
            before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
            metrics.append(job.driver.step(step))
            after = dict(trainer.model.named_parameters())
            moved.append(max(float((after[k].detach() - v).abs().max()) for k, v in before.items()))
            job.driver.weight_sync.publish(step + 1)  # the weights of update `step`, as step + 1 starts
            matched.append(_rollout_matches_trainer(job, cfg))
        job.close(True)
        out[name] = {"metrics": metrics, "matched": matched, "moved": moved}
    return out
