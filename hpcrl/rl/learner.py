"""The learning half of an RL step: a collected `RolloutBatch` in, updated actor (and critic) out.

For B sequences of the batch: old log-probs (actor) and the TIS weights min(pi_old / pi_rollout, C) (Yao
et al. 2025, eq. 3), ref log-probs (reference, when kl_coef > 0), values (critic, PPO), the teacher's
log-probs (distill); token rewards =
outcome on the last token (- kl_coef * KL when kl_in_reward); advantages (hpcrl.rl.advantages registry);
ppo_epochs actor updates (+ critic updates). The colocated step (hpcrl.rl.driver) and the async
placement's training pool (hpcrl.rl.offpolicy.driver) both train through it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hpcrl.algorithm.config import AlgorithmConfig
from hpcrl.rl.advantages import (
    AdvantageInputs,
    compute_advantages,
    kl_shaped_rewards,
    outcome_to_token_rewards,
)
from hpcrl.rl.collector import RolloutBatch
from hpcrl.rl.experience import Experience
from hpcrl.rl.losses import kl_penalty, masked_mean, truncated_is_weights
from hpcrl.rl.objectives import policy_loss_fn, value_loss_fn
from hpcrl.rl.timing import PhaseTimer
from hpcrl.rl.workers import ActorWorker, response_logprobs
from hpcrl.train.workers import TrainerWorker

if TYPE_CHECKING:
    from hpcrl.train.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass
class Models:
    """The trained and the frozen models of the learner, each a worker group on its pool."""

    actor: ActorWorker
    reference: TrainerWorker | None = None
    critic: TrainerWorker | None = None
    teacher: TrainerWorker | None = None
    """The frozen teacher of on-policy distillation (algorithm.name: distill)."""

    def trainers(self) -> dict[str, Trainer]:
        """The trainers checkpointed on this rank, by prefix (a rank outside a role's pool holds a stand-in
        without one: split placement)."""
        out = {"actor.": self.actor.trainer} if self.actor.trainer is not None else {}
        if self.critic is not None and self.critic.trainer is not None:
            out["critic."] = self.critic.trainer
        return out


class Learner:
    """Trains `models` on collected batches with the algorithm's losses."""

    def __init__(self, algo: AlgorithmConfig, max_new_tokens: int, models: Models):
        self.algo, self.models = algo, models
        self.policy_loss = policy_loss_fn(algo, max_new_tokens)
        self.value_loss = value_loss_fn(algo, max_new_tokens)

    def train(self, step: int, batch: RolloutBatch, timer: PhaseTimer, metrics: dict) -> tuple[int, int]:
        """Old/ref log-probs, values, advantages and the updates (phase "train"), their metrics added to
        `metrics` with the batch's reward and length figures. Returns (generated tokens, trained tokens)
        for the throughput figures."""
        exp = batch.exp
        if len(exp) == 0:
            log.warning("step %d: no sample left to train on (skipped rewards / dynamic sampling)", step)
            metrics |= _scores_metrics(batch.sampled_B)
            return 0, 0
        with timer.phase("train"):
            self._prepare(exp, metrics)
            self._update(exp, metrics)
        metrics |= _scores_metrics(batch.sampled_B) | _length_metrics(exp)
        return int(exp.response_mask_BT.sum()), int(exp.train_batch().attention_mask_BT.sum())

    def _prepare(self, exp: Experience, metrics: dict) -> None:
        """Old/ref log-probs, values, token rewards and advantages (all global, response space).

        The forwards start before any result is taken, so split pools run them concurrently."""
        mask = exp.response_mask_BT
        batch = exp.train_batch()
        m = self.models
        pending_old = m.actor.start_forward(batch)
        pending_ref = m.reference.start_forward(batch) if m.reference is not None else None
        pending_values = m.critic.start_forward(batch) if m.critic is not None else None
        pending_teacher = m.teacher.start_forward(batch) if m.teacher is not None else None
        old_logp, _ = response_logprobs(exp, pending_old.result())
        delta = (old_logp - exp.gen.logprobs_BT).abs()[mask.bool()]
        metrics["mismatch/logprob_max"] = float(delta.max()) if delta.numel() else 0.0
        metrics["mismatch/logprob_mean"] = float(delta.mean()) if delta.numel() else 0.0
        exp.tensors["old_logprobs"] = old_logp
        if self.algo.tis_cap is not None:
            weights, tis = truncated_is_weights(old_logp, exp.gen.logprobs_BT, mask, self.algo.tis_cap)
            exp.tensors["tis_weights"] = weights
            metrics["tis/weight_mean"], metrics["tis/clip_frac"] = tis.weight_mean, tis.clip_fraction
        scores = exp.scores_B
        token_rewards = outcome_to_token_rewards(scores, mask, exp.tensors.get("env_rewards_BT"))
        if pending_ref is not None:
            ref_logp, _ = response_logprobs(exp, pending_ref.result())
            exp.tensors["ref_logprobs"] = ref_logp
            kl_BT = kl_penalty(old_logp, ref_logp, self.algo.kl_estimator) * mask
            metrics["kl/ref"] = float(masked_mean(kl_BT, mask))
            if self.algo.kl_in_reward:  # every estimator sees score - beta * sum_t KL_t
                scores, token_rewards = kl_shaped_rewards(token_rewards, mask, kl_BT, self.algo.kl_coef)
                metrics["reward/kl_shaped_mean"] = float(scores.mean())
        teacher_logp = None
        if pending_teacher is not None:
            teacher_logp, _ = response_logprobs(exp, pending_teacher.result())
            # the k1 estimate of KL(student || teacher) per sampled token (what distill descends)
            metrics["distill/reverse_kl"] = float(masked_mean(old_logp - teacher_logp, mask))
        values = None
        if pending_values is not None:
            values = exp.to_response(pending_values.result().values_BT) * mask
            exp.tensors["old_values"] = values
        out = compute_advantages(
            self.algo.name,
            AdvantageInputs(
                scores_B=scores,
                token_rewards_BT=token_rewards,
                mask_BT=mask,
                group_ids_B=exp.group_ids_B,
                values_BT=values,
                baseline_scores_B=exp.tensors.get("baseline_B"),
                logprobs_BT=old_logp,
                teacher_logprobs_BT=teacher_logp,
                task_coef=self.algo.distill_task_coef,
                distill_whiten=self.algo.distill_whiten,
                gamma=self.algo.gamma,
                lam=self.algo.lam,
                norm_adv_by_std=self.algo.norm_adv_by_std,
            ),
        )
        exp.tensors["advantages"] = out.advantages_BT
        exp.tensors["returns"] = out.returns_BT
        metrics["advantage/mean_abs"] = float(masked_mean(out.advantages_BT.abs(), mask))

    def _update(self, exp: Experience, metrics: dict) -> None:
        actor_keys = ["old_logprobs", "advantages"] + [
            k for k in ("ref_logprobs", "tis_weights") if k in exp.tensors
        ]
        actor_batch = exp.train_batch({k: exp.tensors[k] for k in actor_keys})
        critic = self.models.critic
        critic_batch = (
            exp.train_batch({k: exp.tensors[k] for k in ("old_values", "returns")})
            if critic is not None
            else None
        )
        for _ in range(self.algo.ppo_epochs):  # both updates start first: split pools run them concurrently
            pending_actor = self.models.actor.start_update(actor_batch, self.policy_loss)
            pending_critic = None
            if critic_batch is not None:
                pending_critic = critic.start_update(critic_batch, self.value_loss)
            stats = pending_actor.result()
            if pending_critic is not None:
                cstats = pending_critic.result()
        metrics.update({k if "/" in k else f"actor/{k}": v for k, v in stats.items()})
        if critic_batch is not None:
            metrics.update(
                {
                    ("critic/value_loss" if k == "loss" else k if "/" in k else f"critic/{k}"): v
                    for k, v in cstats.items()
                }
            )


def _scores_metrics(scores_B: torch.Tensor) -> dict[str, float]:
    """Reward of every sample drawn this step (before dynamic sampling dropped any group)."""
    if len(scores_B) == 0:
        return {}
    return {
        "reward/mean": float(scores_B.mean()),
        "reward/std": float(scores_B.std()) if len(scores_B) > 1 else 0.0,
    }


def _length_metrics(exp: Experience) -> dict[str, float]:
    lengths = exp.response_mask_BT.sum(dim=1)
    return {"response/length_mean": float(lengths.mean()), "response/length_max": float(lengths.max())}
