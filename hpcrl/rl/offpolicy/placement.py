"""Compose one rank's job for `placement.kind: async`: a training pool and a rollout pool.

Ranks [0, n) are the training pool at the training layout p-t-d (n = p*t*d): the actor with its
optimizer, and the reference and critic when the algorithm has them. Ranks [n, n + r) are the rollout
pool at the generation layout p_g-t_g-d_r (r = p_g*t_g*d_r, d_r = placement.rollout_pool_data): the
rollout engine (hf, megatron at any p_g-t_g, vllm at t_g = 1), the reward and the data sampler. The two
pools run different halves of the step (hpcrl.rl.offpolicy.driver); batches cross by a broadcast from the
first rollout rank to the training ranks (hpcrl.rl.offpolicy.channel), weights by the cross-pool transfer
(hpcrl.reshard.cross_pool, executed by hpcrl.reshard.cross_pool_transfer), and land in the engine through
the colocated hand-off's own per-engine loader (hpcrl.rl.handoff.shard_loader). Rank 0 (training) logs.

Every process group is created by every rank in one fixed order (torch's new_group rule): training
groups, the rollout engine's groups (megatron), the rollout pool's gather group, the batch channel's group,
the transfer's group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from hpcrl.data.cursor import PromptSampler
from hpcrl.distributed.groups import new_group
from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.frozen_models import frozen_models
from hpcrl.reshard.build import model_param_metas
from hpcrl.reshard.cross_pool import plan_cross_pool
from hpcrl.reshard.cross_pool_transfer import CrossPoolTransfer
from hpcrl.rl.collector import Collector
from hpcrl.rl.episodes import build_episode_runner, generation_replica
from hpcrl.rl.handoff import shard_loader
from hpcrl.rl.learner import Learner, Models
from hpcrl.rl.offpolicy.channel import BatchChannel
from hpcrl.rl.offpolicy.driver import AsyncRolloutDriver, AsyncTrainDriver, CursorMirror
from hpcrl.rl.offpolicy.weights import DoubleBufferedWeights, WeightSender
from hpcrl.rl.roles import build_model_roles
from hpcrl.rl.workers import ActorWorker, RolloutWorker
from hpcrl.rollout.engine_rule import ENGINES
from hpcrl.rollout.factory import build_rollout_engine
from hpcrl.rollout.megatron_engine import MegatronRolloutEngine
from hpcrl.train.config import ModelConfig
from hpcrl.train.model import build_train_groups, named_global_params
from hpcrl.train.trainer import build_policy_trainer
from hpcrl.train.workers import Pool, Shards, TrainerWorker


@dataclass(frozen=True)
class AsyncPools:
    """The two pools: `train` at `train_layout`, then `rollout` at `gen_layout` (t = t_g, p = p_g)."""

    train: Pool
    rollout: Pool
    train_layout: ParallelLayout
    gen_layout: ParallelLayout

    @classmethod
    def for_config(cls, cfg: ExperimentConfig) -> AsyncPools:
        p = cfg.parallel
        train_layout = ParallelLayout(tensor=p.tensor, pipeline=p.pipeline, data=p.data)
        gen_layout = ParallelLayout(
            tensor=p.rollout_tensor,
            pipeline=p.rollout_pipeline,
            data=cfg.placement.rollout_pool_data,
            rollout_tensor=p.rollout_tensor,
            rollout_pipeline=p.rollout_pipeline,
        )
        n, r = train_layout.world_size, gen_layout.world_size
        return cls(Pool(0, n, n + r), Pool(n, r, n + r), train_layout, gen_layout)

    @property
    def train_ranks(self) -> list[int]:
        return list(range(self.train.start, self.train.start + self.train.size))

    @property
    def rollout_ranks(self) -> list[int]:
        return list(range(self.rollout.start, self.rollout.start + self.rollout.size))


def async_placement_problems(cfg: ExperimentConfig) -> list[Problem]:
    """Rules of the async placement that need the model (each names its key); its own keys' rules and
    its rank count are hpcrl.distributed.placement's, checked at expand/submit too."""
    p = cfg.parallel
    problems = []
    if cfg.model.tie_word_embeddings and p.rollout_pipeline > 1:
        problems.append(
            Problem(
                "tied embeddings need p_g = 1: the last generation stage would need the embedding for lm_head",
                key="parallel.rollout_pipeline",
            )
        )
    return problems


@dataclass
class AsyncGroups:
    """This rank's process groups of the async placement (None where it is outside)."""

    train: object | None
    """TrainGroups of the training layout (training ranks)."""
    engine: object | None
    """TrainGroups of the generation layout (rollout ranks; megatron engine only)."""
    rollout_gather: object | None
    """The rollout pool (its generation replicas gather their outputs over it); None for one rank."""
    channel: object | None
    """First rollout rank + the training ranks (the batch channel)."""
    transfer: object | None
    """This rank's CrossPoolTransfer."""
    frozen: dict[str, object | None]
    """TrainGroups of each frozen model at a layout of its own, by role (hpcrl.experiment.frozen_models;
    the training ranks)."""

    @classmethod
    def build(
        cls, cfg: ExperimentConfig, pools: AsyncPools, engine_name: str, model_cfg: ModelConfig, rank: int
    ):
        """Collective over the whole world: every rank calls it with the same arguments."""

        timeout, tl, gl = cfg.parallel.timeout_s, pools.train_layout, pools.gen_layout
        train = build_train_groups(tl.tensor, tl.pipeline, tl.data, rank_offset=0, timeout_s=timeout)
        engine = None
        if ENGINES[engine_name].builds_on_generation_groups:
            engine = build_train_groups(
                gl.tensor, gl.pipeline, gl.data, rank_offset=pools.rollout.start, timeout_s=timeout
            )
        frozen = {
            f.role: build_train_groups(
                f.tensor, f.pipeline, f.data(tl.world_size), rank_offset=0, timeout_s=timeout
            )
            for f in frozen_models(cfg)
            if f.own_layout(cfg)
        }
        gather = new_group(pools.rollout_ranks, timeout) if pools.rollout.size > 1 else None
        channel = new_group([pools.rollout.start, *pools.train_ranks], timeout)
        plan = plan_cross_pool(
            model_param_metas(model_cfg, tl.pipeline),
            train=tl,
            train_ranks=pools.train_ranks,
            gen=gl,
            gen_ranks=pools.rollout_ranks,
        )
        transfer = CrossPoolTransfer.build(plan, rank, timeout_s=timeout)
        in_rollout = rank in pools.rollout
        return cls(
            train=train,
            engine=engine,
            rollout_gather=gather if in_rollout else None,
            channel=channel if rank in pools.train or rank == pools.rollout.start else None,
            transfer=transfer,
            frozen=frozen,
        )


def build_training_side(cfg: ExperimentConfig, groups: AsyncGroups) -> tuple[Models, WeightSender]:
    """(Models, WeightSender) of a training rank: actor (+ reference, critic, teacher) on the training pool's
    groups, and the sender of the actor's weights to the rollout pool."""

    mbs, g, balance = cfg.optim.micro_batch_size, groups.train, cfg.optim.balance_dp_tokens
    temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
    trainer = build_policy_trainer(cfg.model, cfg.optim, g, temperature=temperature)
    roles = build_model_roles(
        cfg,
        g,
        lambda model: TrainerWorker(model, mbs, balance_tokens=balance),
        temperature,
        lambda frozen: groups.frozen[frozen.role],
    )

    def params():
        return dict(named_global_params(trainer.model, trainer.model_cfg, g))

    actor = ActorWorker(trainer, mbs, balance_tokens=balance)
    return roles.learner_models(actor), WeightSender(groups.transfer, params)


def build_rollout_side(
    cfg: ExperimentConfig,
    pools: AsyncPools,
    groups: AsyncGroups,
    engine_name: str,
    model_cfg,
    tokenizer,
    rank: int,
) -> tuple[RolloutWorker, DoubleBufferedWeights]:
    """(RolloutWorker, DoubleBufferedWeights) of a rollout rank: the engine at the generation layout, fed
    by the cross-pool transfer through a back buffer."""

    local = rank - pools.rollout.start
    tokens = (tokenizer.pad_token_id, tokenizer.eos_token_id)
    kind = ENGINES[engine_name]
    if kind.builds_on_generation_groups:
        engine = MegatronRolloutEngine.build(
            model_cfg, groups.engine, *tokens, max_rows=cfg.rollout.max_num_seqs
        )
    else:  # hf, or vllm at t_g = 1 (its TP groups would span the world: a placement rule refuses t_g > 1)
        engine = build_rollout_engine(engine_name, cfg.rollout, model_cfg, *tokens)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    back = groups.transfer.allocate(device=device)
    load = shard_loader(engine_name, engine, pools.gen_layout, local, model_cfg)
    coords = pools.gen_layout.rollout_coords(local)
    rollout = RolloutWorker(
        engine,
        Shards(coords.data, pools.gen_layout.rollout_data),
        groups.rollout_gather,
        tokenizer.pad_token_id,
        max_num_seqs=None if kind.schedules_its_batches else cfg.rollout.max_num_seqs,
        episodes=build_episode_runner(cfg.rollout, tokenizer, generation_replica(groups.engine)),
    )
    return rollout, DoubleBufferedWeights(groups.transfer, back, load)


class RLParts(Protocol):
    """How the job builds the RL dataflow's halves over this rank's workers (hpcrl.rl.assemble)."""

    def learner(self, models: Models) -> Learner: ...

    def collector(self, rollout: RolloutWorker) -> Collector: ...

    def sampler(self) -> PromptSampler: ...


def build_async_driver(
    cfg: ExperimentConfig, rank: int, tokenizer, engine_name: str, parts: RLParts
) -> AsyncTrainDriver | AsyncRolloutDriver:
    """This rank's side of the async placement: AsyncTrainDriver over a Learner on the training pool,
    AsyncRolloutDriver over a Collector on the rollout pool. `engine_name`: the resolved rollout engine.
    Collective: every rank calls it (the groups, then each pool's models)."""
    pools = AsyncPools.for_config(cfg)
    model_cfg = cfg.model  # resolved from model.hf_path's config.json by hpcrl.stages.rank.enter_rank
    groups = AsyncGroups.build(cfg, pools, engine_name, model_cfg, rank)
    m = cfg.placement.max_off_policy_steps
    channel = BatchChannel(groups.channel, pools.rollout.start) if groups.channel is not None else None
    if rank in pools.train:
        models, weight_sync = build_training_side(cfg, groups)
        start = parts.sampler()  # the rollout pool's data position until its first message
        mirror = CursorMirror(start.rows, start.cursor)
        return AsyncTrainDriver(parts.learner(models), channel, weight_sync, m, mirror)
    rollout, weights = build_rollout_side(cfg, pools, groups, engine_name, model_cfg, tokenizer, rank)
    return AsyncRolloutDriver(parts.collector(rollout), channel, weights, m, cfg.algorithm.eval_every)
