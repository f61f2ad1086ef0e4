"""Loss callbacks for the trainer: `loss_fn(outputs, micro_batch) -> (loss, metrics)`.

The trainer calls them per micro-batch with sequence-space tensors ([B, S], aligned to tokens) and the
global counts of the whole update batch set on the micro-batch, so each call returns its micro-batch's
contribution and the summed gradients equal the full-batch gradient (hpcrl.train.trainer's contract).
Extras used: old_logprobs, advantages, ref_logprobs (policy); old_values, returns (value).
"""

from __future__ import annotations

import torch

from hpcrl.rl.config import AlgorithmConfig
from hpcrl.rl.losses import (
    agg_loss,
    clipped_value_loss,
    entropy_bonus,
    kl_penalty,
    masked_mean,
    ppo_clip_loss,
)
from hpcrl.train.batch import TrainBatch
from hpcrl.train.logprobs import HeadOutputs


def _denominator(mb: TrainBatch, agg: str) -> float:
    return float(mb.num_global_response_tokens if agg == "token_mean" else mb.num_global_seqs)


def policy_loss_fn(cfg: AlgorithmConfig):
    """PPO-clip policy loss + entropy bonus + (GRPO-style) KL loss term, per AlgorithmConfig."""

    def loss_fn(out: HeadOutputs, mb: TrainBatch) -> tuple[torch.Tensor, dict]:
        mask = mb.response_mask_BT.float()
        denom = _denominator(mb, cfg.loss_agg)
        logp = out.logprobs_BT
        loss, stats = ppo_clip_loss(
            logp,
            mb.extras["old_logprobs"],
            mb.extras["advantages"],
            mask,
            cfg.clip_ratio,
            cfg.loss_agg,
            denom,
        )
        # loss values are micro-batch contributions; the trainer reports the global sum as "loss"
        metrics = {"actor/clip_frac": stats.clip_fraction, "actor/approx_kl": stats.approx_kl}
        with torch.no_grad():
            metrics["actor/entropy"] = masked_mean(out.entropy_BT, mask)
        if cfg.entropy_coef:
            loss = loss + entropy_bonus(out.entropy_BT, mask, cfg.entropy_coef, cfg.loss_agg, denom)
        if cfg.kl_coef and not cfg.kl_in_reward:
            kl_BT = kl_penalty(logp, mb.extras["ref_logprobs"], cfg.kl_estimator)
            loss = loss + cfg.kl_coef * agg_loss(kl_BT, mask, cfg.loss_agg, denom)
            metrics["actor/kl_loss"] = masked_mean(kl_BT.detach(), mask)
        return loss, metrics

    return loss_fn


def value_loss_fn(cfg: AlgorithmConfig):
    """Clipped value loss of the critic (PPO)."""

    def loss_fn(out: HeadOutputs, mb: TrainBatch) -> tuple[torch.Tensor, dict]:
        mask = mb.response_mask_BT.float()
        loss, clip_frac = clipped_value_loss(
            out.values_BT,
            mb.extras["old_values"],
            mb.extras["returns"],
            mask,
            cfg.value_clip,
            cfg.loss_agg,
            _denominator(mb, cfg.loss_agg),
        )
        return loss, {"critic/clip_frac": clip_frac}

    return loss_fn
