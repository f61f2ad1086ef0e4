"""The frozen models a job loads from a directory of their own, and the layout each runs at: the
distillation teacher (`algorithm.teacher_path`) and the reward model when megatron runs it
(`reward.model_backend: megatron`).

Each runs on the ranks of the pool that hosts the learner's models (colocated: every rank; split: the
models pool; async: the training pool), which hold the policy's t * p * d ranks, at (t_F, p_F): by default
the policy's (t, p), else its own, data-parallel over d_F = t * p * d / (t_F * p_F) replicas. One list,
read by the expand rules (hpcrl.experiment.rules), the memory planner (hpcrl.plan.memory) and the ranks
(hpcrl.rl.roles), so the three cannot disagree on which models there are or where they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcrl.algorithm.teacher import teacher_model
from hpcrl.rewards.terms import megatron_reward_model
from hpcrl.train.config import ModelConfig

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig


@dataclass(frozen=True)
class FrozenModel:
    role: str
    """Its name in the job: teacher, reward."""
    who: str
    """Its name in messages and the memory plan."""
    path_key: str
    """The key naming its directory."""
    layout_keys: tuple[str, str]
    """Its tensor and pipeline keys."""
    model: ModelConfig
    scalar_head: bool
    """A reward model's scalar head (no LM head)."""
    tensor: int
    pipeline: int

    def data(self, pool_ranks: int) -> int:
        """d_F: its replicas on a pool of `pool_ranks` ranks (the layout rules check that it divides)."""
        return pool_ranks // (self.tensor * self.pipeline)

    def own_layout(self, cfg: ExperimentConfig) -> bool:
        """It runs at a layout other than the policy's (its own process groups)."""
        return (self.tensor, self.pipeline) != (cfg.parallel.tensor, cfg.parallel.pipeline)


def frozen_models(cfg: ExperimentConfig) -> list[FrozenModel]:
    """The frozen models of `cfg`'s job, in the order the ranks build them."""
    par, algo, reward = cfg.parallel, cfg.algorithm, cfg.reward
    out = []
    teacher = teacher_model(algo, cfg.model)
    if teacher is not None:
        layout = (_or(algo.teacher_tensor, par.tensor), _or(algo.teacher_pipeline, par.pipeline))
        keys = ("algorithm.teacher_tensor", "algorithm.teacher_pipeline")
        out.append(FrozenModel("teacher", "teacher", "algorithm.teacher_path", keys, teacher, False, *layout))
    reward_model = megatron_reward_model(reward, cfg.model)
    if reward_model is not None:
        layout = (_or(reward.model_tensor, par.tensor), _or(reward.model_pipeline, par.pipeline))
        keys = ("reward.model_tensor", "reward.model_pipeline")
        out.append(
            FrozenModel("reward", "reward model", "reward.model_path", keys, reward_model, True, *layout)
        )
    return out


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
