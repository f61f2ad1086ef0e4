"""The models besides the actor, built from the config: the frozen reference (kl_coef > 0), the critic
(an algorithm that needs one: PPO), the frozen teacher (on-policy distillation) and the frozen reward
model when it runs in megatron (`reward.model_backend: megatron`; the Collector scores with it).

Every placement builds them through `build_model_roles` on the pool that hosts them (colocated: every
rank; split: the models pool; async: the training pool), so a new role is added here once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpcrl.algorithm.registry import ALGORITHMS
from hpcrl.algorithm.teacher import teacher_model
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.rewards.terms import megatron_reward_model
from hpcrl.rl.learner import Models
from hpcrl.rl.workers import ActorWorker, TrainerWorker
from hpcrl.train.trainer import Trainer, build_policy_trainer, build_reward_trainer, build_value_trainer

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


def build_model_roles(cfg: ExperimentConfig, groups, worker: WorkerOf, temperature: float) -> ModelRoles:
    """The reference, critic and teacher workers this config's algorithm has (None for the others), on
    `groups` (None: this rank is outside the pool and holds stand-ins without a trainer)."""
    member = groups is not None
    roles = ModelRoles()
    if cfg.algorithm.kl_coef > 0:
        trainer = build_policy_trainer(cfg.model, None, groups, temperature=temperature) if member else None
        roles.reference = worker(trainer)
    if ALGORITHMS[cfg.algorithm.name].needs_critic:
        roles.critic = worker(build_value_trainer(cfg.model, cfg.optim, groups) if member else None)
    teacher_cfg = teacher_model(cfg.algorithm, cfg.model)
    if teacher_cfg is not None:
        trainer = build_policy_trainer(teacher_cfg, None, groups, temperature=temperature) if member else None
        if trainer is not None:
            _check_vocabulary(trainer, cfg)
        roles.teacher = worker(trainer)
    reward_cfg = megatron_reward_model(cfg.reward, cfg.model)
    if reward_cfg is not None:
        roles.reward = worker(build_reward_trainer(reward_cfg, None, groups) if member else None)
    return roles


def _check_vocabulary(teacher: Trainer, cfg: ExperimentConfig) -> None:
    """The teacher scores the student's token ids: one vocabulary (expand checks it where config.json is
    readable; this is the ranks' check for a path that exists only on the cluster)."""
    student = cfg.model.vocab_size
    if student is not None and teacher.model_cfg.vocab_size != student:
        message = f"the teacher's vocab_size {teacher.model_cfg.vocab_size} is not the student's {student}"
        raise ConfigError(Problem(message, cfg.algorithm.teacher_path, "algorithm.teacher_path"))
