"""Compose one rank's RL job from an ExperimentConfig: data, tokenizer, trainers, reshard, rollout, reward.

Composition only; each piece is built by its owner's factory. Placement (`placement.kind`, whose
arithmetic and rules are hpcrl.distributed.placement's; each kind's job builder is in `_JOBS` here):
- colocated: every role on every rank; the actor's weights reach the rollout engine through the reshard
  engine each step (HybridFlow's colocated resource pool).
- split: two disjoint resource pools of the same training layout p-t-d (HybridFlow §4.1): ranks
  [0, n) host the actor and the rollout engine (reshard inside the pool), ranks [n, 2n) host the critic
  and the reference; world = 2n. Batches cross pools through collectives over the default group (the
  worker groups' `Pool.share` / the rollout all-gather); the driver code is the same.
- async: a training pool and a rollout pool that generates the next batches during the update
  (hpcrl.rl.offpolicy.placement composes it, hpcrl.rl.offpolicy.driver runs it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist

from hpcrl.data.cursor import DataCursor, PromptSampler
from hpcrl.data.sources import load_splits
from hpcrl.data.tokenizer import encode_prompts, model_tokenizer
from hpcrl.distributed.layout import ParallelLayout
from hpcrl.distributed.placement import placement_of
from hpcrl.env.replica import ReplicaGroup
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.metrics.logger import MetricsLogger
from hpcrl.reshard.build import ENGINE_FAMILIES, build_reshard_engine
from hpcrl.reshard.transport import make_groups
from hpcrl.rewards.scoring import build_scorer, task_rule_scorer
from hpcrl.rewards.terms import scores_nothing
from hpcrl.rl.collector import Collector, CollectorSettings, PromptCodec
from hpcrl.rl.driver import RLDriver
from hpcrl.rl.episodes import build_episode_runner, generation_replica
from hpcrl.rl.handoff import SideInputs, build_rollout_side
from hpcrl.rl.learner import Learner, Models
from hpcrl.rl.offpolicy.placement import async_placement_problems, build_async_driver
from hpcrl.rl.reward_worker import MegatronRewardScorer
from hpcrl.rl.roles import ModelRoles, build_model_roles
from hpcrl.rl.weight_sync import NoWeightSync, WeightSync
from hpcrl.rl.workers import ActorWorker, RolloutWorker
from hpcrl.rollout.base import SamplingParams
from hpcrl.rollout.engine_rule import ENGINES, EngineFacts, resolve_engine
from hpcrl.stages.stateful import DataCursorState, Stateful
from hpcrl.stages.tracking import metrics_logger
from hpcrl.train.model import build_generation_groups, build_train_groups, named_global_params
from hpcrl.train.trainer import build_policy_trainer
from hpcrl.train.workers import Pool, Shards, TrainerWorker

if TYPE_CHECKING:
    from hpcrl.train.trainer import Trainer


def training_world(cfg: ExperimentConfig, world: int) -> int:
    """Ranks of one training layout: the world (colocated) or one of the two equal pools (split)."""
    return world * cfg.parallel.world_size // cfg.ranks_per_element


def _resolve_rollout_engine(cfg: ExperimentConfig, facts: EngineFacts) -> tuple[str, list[Problem]]:
    p = cfg.parallel
    split = not placement_of(cfg.placement).rollout_spans_element
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
    """The job's world against what its placement's pools need (its own keys' rules are checked at
    expand: hpcrl.experiment.rules), and the async placement's rules that need the model."""
    placement = placement_of(cfg.placement)
    need = placement.ranks(cfg.parallel, cfg.placement)
    problems = []
    if world != need:
        keys, sizes = placement.ranks_formula(cfg.parallel, cfg.placement)
        problems.append(
            Problem(
                f"{placement.name} placement runs {keys} = {sizes} = {need} ranks, the job has {world}",
                key="placement.kind",
            )
        )
    return problems + (async_placement_problems(cfg) if placement.off_policy else [])


@dataclass(frozen=True)
class Pools:
    """Where each role lives: `actor` hosts actor + rollout, `models` the critic and the reference."""

    actor: Pool
    models: Pool

    @classmethod
    def for_config(cls, cfg: ExperimentConfig, world: int) -> Pools:
        if placement_of(cfg.placement).models_pool:
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
    driver: object
    """The step runner (`step(i)`, `final_evaluation(n)`, a `sampler`): RLDriver, or an async pool's
    driver (hpcrl.rl.offpolicy.driver) on that placement."""
    logger: MetricsLogger
    trainers: dict[str, Trainer] = field(default_factory=dict)
    """The trainers checkpointed on this rank, by prefix (hpcrl.rl.learner.Models.trainers)."""
    states: list[Stateful] = field(default_factory=list)
    """Checkpointed state beyond the trainers: the data cursor first, then the placement's own
    (hpcrl.stages.stateful)."""
    close: Callable[[bool], None] = field(default=lambda wait: None)
    """Stops what the job runs in the background (the async rollout's receive thread); the argument says
    whether to wait for work in flight (a run that ended well) or not (a failed one)."""


def build_job(cfg: ExperimentConfig, run_dir: Path, rank: int, world: int) -> Job:
    problems = placement_problems(cfg, world)
    if problems:
        raise ConfigError(problems)
    tokenizer = model_tokenizer(cfg.model.hf_path, cfg.model.vocab_size)
    train, heldout = load_splits(cfg.data, tokenizer)
    encode_prompts(tokenizer, [e.prompt for e in train + heldout], cfg.data.max_prompt_length)  # fail early
    inputs = JobInputs(cfg, run_dir, rank, world, tokenizer, train, heldout)
    return _JOBS[cfg.placement.kind](inputs)


@dataclass(frozen=True)
class JobInputs:
    """What building one rank's job of any placement takes."""

    cfg: ExperimentConfig
    run_dir: Path
    rank: int
    world: int
    tokenizer: object
    train: list
    heldout: list

    def logger(self) -> MetricsLogger:
        return metrics_logger(self.cfg, self.run_dir, self.cfg.algorithm.steps, is_main=self.rank == 0)

    def learner(self, models: Models) -> Learner:
        return Learner(self.cfg.algorithm, self.cfg.rollout.response_tokens(), models)

    def collector(self, rollout: RolloutWorker, reward_model: TrainerWorker | None = None) -> Collector:
        return build_collector(self.cfg, rollout, self.tokenizer, self.sampler(), self.heldout, reward_model)

    def sampler(self) -> PromptSampler:
        """The training prompts from the start of the data (a resume moves the cursor)."""
        return PromptSampler(self.train, DataCursor(seed=self.cfg.data.shuffle_seed))


def _pooled_job(i: JobInputs) -> Job:
    """colocated (one pool: every rank) and split (actor + rollout, then critic + reference): the same
    driver over worker groups on `Pools`."""
    pools = Pools.for_config(i.cfg, i.world)
    actor_groups, model_groups = _pool_groups(i.cfg, pools)
    actor, rollout, weight_sync = _build_actor_and_rollout(
        i.cfg, i.tokenizer, pools.actor, actor_groups, i.rank, i.world
    )
    roles = _build_model_pool(i.cfg, pools.models, model_groups)
    models = roles.learner_models(actor)
    collector = i.collector(rollout, roles.reward)
    driver = RLDriver(collector, i.learner(models), weight_sync, i.cfg.algorithm.eval_every)
    return Job(driver, i.logger(), trainers=models.trainers(), states=[DataCursorState(collector)])


def _async_job(i: JobInputs) -> Job:
    """The training pool's or the rollout pool's side of the async placement (hpcrl.rl.offpolicy.placement)."""
    driver = build_async_driver(i.cfg, i.rank, i.tokenizer, rollout_engine_for(i.cfg), i)
    return Job(driver, i.logger(), driver.trainers(), [driver.data_cursor(), driver], close=driver.close)


_JOBS: dict[str, Callable[[JobInputs], Job]] = {
    "colocated": _pooled_job,
    "split": _pooled_job,
    "async": _async_job,
}
"""How each placement kind (hpcrl.distributed.placement.PLACEMENTS) builds a rank's job."""


def build_collector(
    cfg: ExperimentConfig,
    rollout: RolloutWorker,
    tokenizer,
    sampler,
    heldout: list,
    reward_model: TrainerWorker | None = None,
) -> Collector:
    """A Collector over `rollout` with this config's sampling, reward, data and codec; `reward_model`:
    the reward model's worker when it runs in megatron (hpcrl.rl.roles)."""
    codec = PromptCodec(
        encode=lambda texts: encode_prompts(tokenizer, texts, cfg.data.max_prompt_length),
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        eos_id=tokenizer.eos_token_id,
    )
    settings = CollectorSettings(
        cfg.algorithm,
        SamplingParams.from_config(cfg.rollout),
        cfg.rollout.samples_per_prompt,
        cfg.reward.nan_policy,
        seed=cfg.seed,
        env=cfg.rollout.env,
    )
    model = MegatronRewardScorer(reward_model, tokenizer) if reward_model is not None else None
    scorer = build_scorer(cfg.reward, cfg.data, model=model, environment=cfg.rollout.env is not None)
    # an environment that alone rewards (reward.name null) is the task's judge: its own numbers
    # (reward/heldout_env/success) say how well it is solved, not the data task's rule on the last turn
    environment_only = cfg.rollout.env is not None and scores_nothing(cfg.reward)
    task_scorer = None if environment_only else task_rule_scorer(cfg.reward, cfg.data)
    return Collector(settings, rollout, codec, scorer, sampler, heldout, task_scorer)


def _temperature(cfg: ExperimentConfig) -> float:
    return cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0


def _build_actor_and_rollout(
    cfg: ExperimentConfig, tokenizer, pool: Pool, groups, rank: int, world: int
) -> tuple[ActorWorker, RolloutWorker, WeightSync]:
    """Actor trainer, rollout engine and the reshard hand-off between them on the actor pool; stand-ins
    elsewhere."""

    p = cfg.parallel
    layout = ParallelLayout.from_config(p)  # the actor pool's ranks are [0, layout.world_size)
    engine_name = rollout_engine_for(cfg)
    kind = ENGINES[engine_name]
    # episodes on an engine without generation groups (SPMD vLLM at t_g > 1) need its replicas' groups
    replicas = ("rollout_model_parallel",) if cfg.rollout.env and not kind.builds_on_generation_groups else ()
    reshard_groups = make_groups(layout, ENGINE_FAMILIES + replicas, timeout_s=p.timeout_s)  # every rank
    generation_groups = (  # collective over every rank, like the reshard groups
        build_generation_groups(layout, timeout_s=p.timeout_s) if kind.builds_on_generation_groups else None
    )
    world_group = dist.group.WORLD if world > 1 else None
    mbs = cfg.optim.micro_batch_size
    if rank not in pool:
        actor = ActorWorker(None, mbs, pool, balance_tokens=cfg.optim.balance_dp_tokens)
        return actor, RolloutWorker(None, Shards(-1, 1), world_group, tokenizer.pad_token_id), NoWeightSync()
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
    actor = ActorWorker(trainer, mbs, pool, balance_tokens=cfg.optim.balance_dp_tokens)
    shards = Shards(layout.rollout_coords(rank).data, layout.rollout_data)
    rollout = RolloutWorker(
        side.engine,
        shards,
        world_group,
        tokenizer.pad_token_id,
        sleep=side.sleep,
        max_num_seqs=None if kind.schedules_its_batches else cfg.rollout.max_num_seqs,
        episodes=build_episode_runner(
            cfg.rollout, tokenizer, _episode_replica(generation_groups, reshard_groups)
        ),
    )
    return actor, rollout, side.handoff


def _episode_replica(generation_groups, reshard_groups: dict) -> ReplicaGroup | None:
    """This rank's generation replica when it spans several ranks (its leader steps the environments)."""
    if generation_groups is not None:
        return generation_replica(generation_groups)
    group = reshard_groups.get("rollout_model_parallel")
    return None if group is None or group.handle is None else ReplicaGroup(group.handle, group.ranks[0])


def _bucket_bytes(p) -> int:
    return max(1, int(p.reshard_bucket_mb * 2**20))


def _build_model_pool(cfg: ExperimentConfig, pool: Pool, groups) -> ModelRoles:
    """The reference, critic, teacher and reward-model worker groups on the models pool (hpcrl.rl.roles);
    collective (a frozen model at a layout of its own gets its process groups here, on every rank)."""

    def worker(trainer):
        return TrainerWorker(
            trainer, cfg.optim.micro_batch_size, pool, balance_tokens=cfg.optim.balance_dp_tokens
        )

    def own_groups(frozen):  # on the models pool's ranks
        p = cfg.parallel
        data = frozen.data(p.world_size)
        return build_train_groups(
            frozen.tensor, frozen.pipeline, data, rank_offset=pool.start, timeout_s=p.timeout_s
        )

    return build_model_roles(cfg, groups, worker, _temperature(cfg), own_groups)
