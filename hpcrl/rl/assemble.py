"""Compose one rank's RL job from an ExperimentConfig: data, tokenizer, trainers, reshard, rollout, reward.

Composition only; each piece is built by its owner's factory. Placement (`algorithm.placement`):
- colocated: every role on every rank; the actor's weights reach the rollout engine through the reshard
  engine each step (HybridFlow's colocated resource pool).
- split: two disjoint resource pools of the same training layout p-t-d (HybridFlow §4.1): ranks
  [0, n) host the actor and the rollout engine (reshard inside the pool), ranks [n, 2n) host the critic
  and the reference; world = 2n. Batches cross pools through collectives over the default group (the
  worker groups' `Pool.share` / the rollout all-gather); the driver code is the same.
- async: a training pool and a rollout pool that generates the next batches during the update
  (hpcrl.rl.async_placement composes it, hpcrl.rl.async_driver runs it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from hpcrl.algorithm.registry import ALGORITHMS
from hpcrl.data.cursor import DataCursor, PromptSampler
from hpcrl.data.sources import load_splits
from hpcrl.data.tokenizer import encode_prompts, model_tokenizer
from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.metrics.logger import MetricsLogger
from hpcrl.reshard.build import ENGINE_FAMILIES, build_reshard_engine
from hpcrl.reshard.transport import make_groups
from hpcrl.rewards.scoring import build_scorer
from hpcrl.rl.async_placement import async_placement_problems, build_async_driver
from hpcrl.rl.driver import PromptCodec, RLDriver, Workers
from hpcrl.rl.handoff import SideInputs, build_rollout_side
from hpcrl.rl.workers import ActorWorker, Pool, RolloutWorker, Shards, TrainerWorker
from hpcrl.rollout.base import SamplingParams
from hpcrl.rollout.engine_rule import ENGINES, EngineFacts, resolve_engine
from hpcrl.train.model import build_generation_groups, build_train_groups, named_global_params
from hpcrl.train.trainer import build_policy_trainer, build_value_trainer


def has_second_pool_roles(cfg: ExperimentConfig) -> bool:
    """Whether the job has a critic (ppo) or a reference (kl_coef > 0): the roles of the second pool."""
    return ALGORITHMS[cfg.algorithm.name].needs_critic or cfg.algorithm.kl_coef > 0


def training_world(cfg: ExperimentConfig, world: int) -> int:
    """Ranks of one training layout: the world (colocated) or one of the two equal pools (split)."""
    return world * cfg.parallel.world_size // cfg.ranks_per_element


def _resolve_rollout_engine(cfg: ExperimentConfig, facts: EngineFacts) -> tuple[str, list[Problem]]:
    p = cfg.parallel
    split = cfg.algorithm.placement != "colocated"  # the rollout engine does not span the world
    return resolve_engine(
        cfg.rollout, p.rollout_tensor, p.rollout_pipeline, cfg.model, facts, split_placement=split
    )


def rollout_engine_problems(cfg: ExperimentConfig, facts: EngineFacts) -> list[Problem]:
    """Whether the configured (or auto) rollout engine can run the generation layout and model source."""
    return _resolve_rollout_engine(cfg, facts)[1]


def rollout_engine_for(cfg: ExperimentConfig) -> str:
    """The rollout engine this rank runs (ConfigError when it cannot run the config here)."""
    name, problems = _resolve_rollout_engine(cfg, EngineFacts.here())
    if problems:
        raise ConfigError(problems)
    return name


def placement_problems(cfg: ExperimentConfig, world: int) -> list[Problem]:
    """Rules of `algorithm.placement` (each Problem names its key); empty when the placement fits."""
    if cfg.algorithm.placement == "async":
        return async_placement_problems(cfg, world)
    if cfg.algorithm.placement != "split":
        return []
    problems = []
    pool = cfg.parallel.world_size
    if world != 2 * pool:
        problems.append(
            Problem(
                f"split placement runs two pools of the training layout (tensor*pipeline*data = {pool} "
                f"ranks each): the job needs {2 * pool} ranks, it has {world}",
                key="algorithm.placement",
            )
        )
    if not has_second_pool_roles(cfg):
        problems.append(
            Problem(
                f"split placement puts the critic and the reference on their own pool, but "
                f"{cfg.algorithm.name} with kl_coef=0 has neither (use colocated)",
                key="algorithm.placement",
            )
        )
    return problems


@dataclass(frozen=True)
class Pools:
    """Where each role lives: `actor` hosts actor + rollout, `models` the critic and the reference."""

    actor: Pool
    models: Pool

    @classmethod
    def for_config(cls, cfg: ExperimentConfig, world: int) -> Pools:
        if cfg.algorithm.placement == "split":
            n = cfg.parallel.world_size
            return cls(Pool(0, n, world), Pool(n, n, world))
        return cls(Pool.everywhere(world), Pool.everywhere(world))


def _pool_groups(cfg: ExperimentConfig, pools: Pools):
    """(actor-pool groups, model-pool groups) of this rank, None where it is outside a pool. Collective:
    every rank creates every group (torch's new_group rule)."""

    p = cfg.parallel
    kwargs = {
        "timeout_s": p.timeout_s
    }  # a dead peer is an error after parallel.timeout_s, not torch's default
    actor = build_train_groups(p.tensor, p.pipeline, p.data, rank_offset=pools.actor.start, **kwargs)
    if pools.models == pools.actor:
        return actor, actor
    return actor, build_train_groups(p.tensor, p.pipeline, p.data, rank_offset=pools.models.start, **kwargs)


@dataclass
class Job:
    driver: RLDriver
    """The step runner: RLDriver, or an async pool's driver (hpcrl.rl.async_driver) on that placement."""
    logger: MetricsLogger
    extra: object | None = None
    """Checkpointed state beyond trainers and data cursor (hpcrl.rl.checkpointing.CheckpointedState)."""
    close: Callable[[bool], None] = field(default=lambda wait: None)
    """Stops what the job runs in the background (the async rollout's receive thread); the argument says
    whether to wait for work in flight (a run that ended well) or not (a failed one)."""


def build_job(cfg: ExperimentConfig, run_dir: Path, rank: int, world: int) -> Job:
    problems = placement_problems(cfg, world)
    if problems:
        raise ConfigError(problems)
    tokenizer = model_tokenizer(cfg.model.hf_path, cfg.model.vocab_size)
    train, heldout = load_splits(cfg.data)
    encode_prompts(tokenizer, [e.prompt for e in train + heldout], cfg.data.max_prompt_length)  # fail early
    if cfg.algorithm.placement == "async":

        def core(workers: Workers) -> RLDriver:
            return core_driver(cfg, workers, tokenizer, train, heldout)

        driver = build_async_driver(cfg, rank, tokenizer, rollout_engine_for(cfg), core)
        logger = MetricsLogger(cfg.logging, run_dir, cfg.algorithm.steps, is_main=rank == 0)
        return Job(driver=driver, logger=logger, extra=driver, close=driver.close)
    pools = Pools.for_config(cfg, world)
    actor_groups, model_groups = _pool_groups(cfg, pools)
    actor, rollout = _build_actor_and_rollout(cfg, tokenizer, pools.actor, actor_groups, rank, world)
    reference, critic = _build_model_pool(cfg, pools.models, model_groups)
    driver = core_driver(cfg, Workers(actor, rollout, reference, critic), tokenizer, train, heldout)
    logger = MetricsLogger(cfg.logging, run_dir, cfg.algorithm.steps, is_main=rank == 0)
    return Job(driver=driver, logger=logger)


def core_driver(cfg: ExperimentConfig, workers: Workers, tokenizer, train: list, heldout: list) -> RLDriver:
    """The RL dataflow over `workers` with this config's sampling, reward, data and codec."""
    codec = PromptCodec(
        encode=lambda texts: encode_prompts(tokenizer, texts, cfg.data.max_prompt_length),
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        eos_id=tokenizer.eos_token_id,
    )
    return RLDriver(
        cfg.algorithm,
        SamplingParams.from_config(cfg.rollout),
        cfg.rollout.samples_per_prompt,
        workers,
        codec,
        build_scorer(cfg.reward, cfg.data),
        cfg.reward.nan_policy,
        PromptSampler(train, DataCursor(seed=cfg.data.shuffle_seed)),
        heldout,
        seed=cfg.seed,
    )


def _temperature(cfg: ExperimentConfig) -> float:
    return cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0


def _build_actor_and_rollout(cfg: ExperimentConfig, tokenizer, pool: Pool, groups, rank: int, world: int):
    """Actor trainer + reshard engine + rollout engine on the actor pool; stand-ins elsewhere."""

    p = cfg.parallel
    layout = ParallelLayout.from_config(p)  # the actor pool's ranks are [0, layout.world_size)
    engine_name = rollout_engine_for(cfg)
    kind = ENGINES[engine_name]
    reshard_groups = make_groups(layout, ENGINE_FAMILIES, timeout_s=p.timeout_s)  # every rank
    generation_groups = (  # collective over every rank, like the reshard groups
        build_generation_groups(layout, timeout_s=p.timeout_s) if kind.builds_on_generation_groups else None
    )
    world_group = dist.group.WORLD if world > 1 else None
    mbs = cfg.optim.micro_batch_size
    if rank not in pool:
        actor = ActorWorker(None, None, mbs, pool)
        return actor, RolloutWorker(None, Shards(-1, 1), world_group, tokenizer.pad_token_id)
    trainer = build_policy_trainer(cfg.model, cfg.optim, groups, temperature=_temperature(cfg))
    model_cfg = trainer.model_cfg  # read from the HF directory when model.hf_path is set
    params = dict(named_global_params(trainer.model, model_cfg, groups))  # read in place, never moved
    reshard = build_reshard_engine(
        model_cfg, layout, params, rank=rank, groups=reshard_groups, bucket_bytes=_bucket_bytes(p)
    )

    def written() -> dict:  # the weights as the optimizer wrote them (hpcrl.train.update.written_view)
        return {name: trainer.update_step.written_view(param) for name, param in params.items()}

    side = build_rollout_side(
        engine_name,
        SideInputs(
            cfg.rollout,
            model_cfg,
            layout,
            rank,
            reshard,
            generation_groups,
            (tokenizer.pad_token_id, tokenizer.eos_token_id),
            written=written if p.verify_weight_sync else None,
        ),
    )
    actor = ActorWorker(trainer, side.handoff, mbs, pool)
    shards = Shards(layout.rollout_coords(rank).data, layout.rollout_data)
    return actor, RolloutWorker(
        side.engine,
        shards,
        world_group,
        tokenizer.pad_token_id,
        sleep=side.sleep,
        max_num_seqs=None if kind.schedules_its_batches else cfg.rollout.max_num_seqs,
    )


def _bucket_bytes(p) -> int:
    return max(1, int(p.reshard_bucket_mb * 2**20))


def _build_model_pool(cfg: ExperimentConfig, pool: Pool, groups):
    """(reference, critic) worker groups, each None when the algorithm has no such role."""

    mbs = cfg.optim.micro_batch_size
    member = groups is not None
    reference = critic = None
    if cfg.algorithm.kl_coef > 0:
        trainer = (
            build_policy_trainer(cfg.model, None, groups, temperature=_temperature(cfg)) if member else None
        )
        reference = TrainerWorker(trainer, mbs, pool)
    if ALGORITHMS[cfg.algorithm.name].needs_critic:
        critic = TrainerWorker(
            build_value_trainer(cfg.model, cfg.optim, groups) if member else None, mbs, pool
        )
    return reference, critic
