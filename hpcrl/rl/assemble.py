"""Compose one rank's RL job from an ExperimentConfig: data, tokenizer, trainers, reshard, rollout, reward.

Composition only; each piece is built by its owner's factory. Colocated placement: every role on every
rank, the actor's weights reach the rollout engine through the reshard engine each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from hpcrl.config.experiment import ExperimentConfig
from hpcrl.data.cursor import DataCursor, PromptSampler
from hpcrl.data.sources import load_splits
from hpcrl.data.tokenizer import encode_prompts
from hpcrl.metrics.logger import MetricsLogger
from hpcrl.rl.driver import PromptCodec, RLDriver, Workers
from hpcrl.rl.workers import ActorWorker, RolloutWorker, Shards, TrainerWorker
from hpcrl.rollout.base import SamplingParams


def build_tokenizer(cfg: ExperimentConfig):
    """The model directory's tokenizer when starting from HF weights, else the built-in char tokenizer."""
    if cfg.model.hf_path is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.model.hf_path, local_files_only=True)
        if tokenizer.pad_token is None:  # e.g. Llama-2: padding is masked out, any id will do
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
    from hpcrl.data.tasks import ALPHABET
    from hpcrl.data.tokenizer import build_char_tokenizer

    return build_char_tokenizer(ALPHABET, vocab_size=cfg.model.vocab_size)


class ReshardHandoff:
    """train -> rollout weight hand-off through the 3D-HybridEngine (hpcrl.reshard), once per sync."""

    def __init__(self, engine, layout, rank: int, model_cfg):
        self.engine, self.layout, self.rank, self.model_cfg = engine, layout, rank, model_cfg

    def __call__(self, rollout: RolloutWorker) -> int:
        from hpcrl.reshard.convert import rollout_weights

        shard = self.engine.to_generation()
        try:
            return rollout.load_weights(rollout_weights(shard, self.layout, self.rank, self.model_cfg))
        finally:
            self.engine.to_training(shard)


@dataclass
class Job:
    driver: RLDriver
    logger: MetricsLogger


def build_job(cfg: ExperimentConfig, run_dir: Path, rank: int, world: int) -> Job:
    from hpcrl.dist.layout import ParallelLayout
    from hpcrl.reshard.build import ENGINE_FAMILIES, build_reshard_engine
    from hpcrl.reshard.transport import make_groups
    from hpcrl.rewards.scoring import build_scorer
    from hpcrl.rollout.factory import build_rollout_engine
    from hpcrl.train.model import build_train_groups, named_global_params
    from hpcrl.train.trainer import build_policy_trainer, build_value_trainer

    tokenizer = build_tokenizer(cfg)
    train, heldout = load_splits(cfg.data)
    encode_prompts(tokenizer, [e.prompt for e in train + heldout], cfg.data.max_prompt_length)  # fail early
    layout = ParallelLayout.from_config(cfg.parallel)
    groups = build_train_groups(cfg.parallel.tensor, cfg.parallel.pipeline, cfg.parallel.data)
    temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
    actor_trainer = build_policy_trainer(cfg.model, cfg.optim, groups, temperature=temperature)
    model_cfg = actor_trainer.model_cfg  # read from the HF directory when model.hf_path is set
    reshard_groups = make_groups(layout, ENGINE_FAMILIES, timeout_s=cfg.parallel.timeout_s)
    reshard = build_reshard_engine(model_cfg, layout, rank=rank, groups=reshard_groups)
    reshard.bind(dict(named_global_params(actor_trainer.model, model_cfg, groups)))
    mbs = cfg.optim.micro_batch_size
    actor = ActorWorker(actor_trainer, ReshardHandoff(reshard, layout, rank, model_cfg), mbs)
    reference = None
    if cfg.algorithm.kl_coef > 0:
        reference = TrainerWorker(build_policy_trainer(cfg.model, None, groups, temperature=temperature), mbs)
    critic = None
    if cfg.algorithm.name == "ppo":
        critic = TrainerWorker(build_value_trainer(cfg.model, cfg.optim, groups), mbs)
    engine = build_rollout_engine(cfg.rollout, model_cfg, tokenizer.pad_token_id, tokenizer.eos_token_id)
    coords = layout.rollout_coords(rank)
    world_group = dist.group.WORLD if world > 1 else None
    rollout = RolloutWorker(
        engine, Shards(coords.data, layout.rollout_data), world_group, tokenizer.pad_token_id
    )

    codec = PromptCodec(
        encode=lambda texts: encode_prompts(tokenizer, texts, cfg.data.max_prompt_length),
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        eos_id=tokenizer.eos_token_id,
    )
    cursor = DataCursor(seed=cfg.data.shuffle_seed)
    driver = RLDriver(
        cfg.algorithm,
        SamplingParams.from_config(cfg.rollout),
        cfg.rollout.samples_per_prompt,
        Workers(actor, rollout, reference, critic),
        codec,
        build_scorer(cfg.reward, cfg.data),
        cfg.reward.nan_policy,
        PromptSampler(train, cursor),
        heldout,
        seed=cfg.seed,
    )
    logger = MetricsLogger(cfg.logging, run_dir, cfg.algorithm.steps, is_main=rank == 0)
    return Job(driver=driver, logger=logger)
