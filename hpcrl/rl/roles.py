"""The models besides the actor, built from the config: the frozen reference (kl_coef > 0), the critic
(an algorithm that needs one: PPO), the frozen teacher (on-policy distillation) and the frozen reward
model when it runs in megatron (`reward.model_backend: megatron`; the Collector scores with it).

Every placement builds them through `build_model_roles` on the pool that hosts them (colocated: every
rank; split: the models pool; async: the training pool), so a new role is added here once. The teacher
and the reward model may run at a layout of their own on that pool (hpcrl.experiment.frozen_models).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpcrl.algorithm.registry import ALGORITHMS
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.frozen_models import FrozenModel, frozen_models
from hpcrl.rl.learner import Models
from hpcrl.rl.workers import ActorWorker
from hpcrl.train.trainer import Trainer, build_policy_trainer, build_reward_trainer, build_value_trainer
from hpcrl.train.workers import TrainerWorker

WorkerOf = Callable[[Trainer | None], TrainerWorker]
"""Wraps a rank's trainer (None on a rank outside the pool) into the pool's worker group."""


@dataclass
class ModelRoles:
    reference: TrainerWorker | None = None
    critic: TrainerWorker | None = None
    teacher: TrainerWorker | None = None
    reward: TrainerWorker | None = None
    """The reward model (the Collector's, not the learner's)."""

    def learner_models(self, actor: ActorWorker) -> Models:
        return Models(actor, self.reference, self.critic, self.teacher)


def build_model_roles(
    cfg: ExperimentConfig,
    groups,
    worker: WorkerOf,
    temperature: float,
    own_groups: Callable[[FrozenModel], object],
) -> ModelRoles:
    """The reference, critic, teacher and reward-model workers this config has (None for the others), on
    `groups` (None: this rank is outside the pool and holds stand-ins without a trainer); a frozen model
    at a layout of its own on `own_groups(frozen)` (hpcrl.experiment.frozen_models), which every rank
    calls in this order (new process groups are collective)."""
    member = groups is not None
    roles = ModelRoles()
    packed = cfg.optim.pack_sequences  # the frozen models run the actor's batches as it does
    if cfg.algorithm.kl_coef > 0:
        trainer = (
            build_policy_trainer(cfg.model, None, groups, temperature=temperature, pack_sequences=packed)
            if member
            else None
        )
        roles.reference = worker(trainer)
    if ALGORITHMS[cfg.algorithm.name].needs_critic:
        roles.critic = worker(build_value_trainer(cfg.model, cfg.optim, groups) if member else None)
    for frozen in frozen_models(cfg):
        its_groups = own_groups(frozen) if frozen.own_layout(cfg) else groups
        trainer = None
        if its_groups is not None and frozen.scalar_head:
            trainer = build_reward_trainer(frozen.model, None, its_groups, pack_sequences=packed)
        elif its_groups is not None:
            trainer = build_policy_trainer(
                frozen.model, None, its_groups, temperature=temperature, pack_sequences=packed
            )
        setattr(roles, frozen.role, worker(_same_vocabulary(trainer, cfg, frozen.path_key, frozen.who)))
    return roles


def _same_vocabulary(frozen: Trainer | None, cfg: ExperimentConfig, key: str, who: str) -> Trainer | None:
    """`frozen`, which reads the policy's token ids, after checking it has the policy's vocabulary (expand
    checks it where config.json is readable; this is the ranks' check for a path that exists only on the
    cluster)."""
    policy = cfg.model.vocab_size
    if frozen is not None and policy is not None and frozen.model_cfg.vocab_size != policy:
        message = f"the {who}'s vocab_size {frozen.model_cfg.vocab_size} is not the policy's {policy}"
        raise ConfigError(Problem(message, frozen.model_cfg.hf_path, key))
    return frozen
