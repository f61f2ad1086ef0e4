"""Loss callbacks for the trainer: `loss_fn(outputs, micro_batch) -> (loss, metrics)`.

The trainer calls them per micro-batch with sequence-space tensors ([B, S], aligned to tokens) and the
global counts of the whole update batch set on the micro-batch, so each call returns its micro-batch's
contribution and the summed gradients equal the full-batch gradient (hpcrl.train.trainer's contract).
Extras used: old_logprobs, advantages, ref_logprobs, tis_weights (policy); old_values, returns (value).
"""

from __future__ import annotations

import torch

from hpcrl.algorithm.config import AlgorithmConfig
from hpcrl.rl.losses import (
    ClipRange,
    agg_loss,
    clipped_value_loss,
    entropy_bonus,
    kl_penalty,
    masked_mean,
    ppo_clip_loss,
)
from hpcrl.train.batch import TrainBatch
from hpcrl.train.logprobs import HeadOutputs


def _denominator(mb: TrainBatch, agg: str, norm_length: int) -> float:
    if agg == "token_mean":
        return float(mb.num_global_response_tokens)
    if agg == "seq_mean_token_sum_norm":
        return float(mb.num_global_seqs * norm_length)
    return float(mb.num_global_seqs)


def clip_range(cfg: AlgorithmConfig) -> ClipRange:
    """The PPO trust region an AlgorithmConfig asks for (one place that reads the three clip keys)."""
    return ClipRange(
        low=cfg.clip_ratio if cfg.clip_ratio_low is None else cfg.clip_ratio_low,
        high=cfg.clip_ratio if cfg.clip_ratio_high is None else cfg.clip_ratio_high,
        dual_c=cfg.clip_ratio_c,
    )


def policy_loss_fn(cfg: AlgorithmConfig, max_new_tokens: int):
    """PPO-clip policy loss (clip-higher, dual clip, TIS weights when the batch has them) + entropy bonus
    + (GRPO-style) KL loss term, per AlgorithmConfig. `max_new_tokens` is Dr. GRPO's constant length."""
    clip = clip_range(cfg)

    def loss_fn(out: HeadOutputs, mb: TrainBatch) -> tuple[torch.Tensor, dict]:
        mask = mb.response_mask_BT.float()
        # (mode, global denominator, Dr. GRPO's length): every term aggregates the same way
        agg = (cfg.loss_agg, _denominator(mb, cfg.loss_agg, max_new_tokens), max_new_tokens)
        logp = out.logprobs_BT
        loss, stats = ppo_clip_loss(
            logp,
            mb.extras["old_logprobs"],
            mb.extras["advantages"],
            mask,
            clip,
            *agg,
            weights_BT=mb.extras.get("tis_weights"),
        )
        # loss values are micro-batch contributions; the trainer reports the global sum as "loss"
        metrics = {
            "actor/clip_frac": stats.clip_fraction,
            "actor/dual_clip_frac": stats.dual_clip_fraction,
            "actor/approx_kl": stats.approx_kl,
        }
        with torch.no_grad():
            metrics["actor/entropy"] = masked_mean(out.entropy_BT, mask)
        if cfg.entropy_coef:
            loss = loss + entropy_bonus(out.entropy_BT, mask, cfg.entropy_coef, *agg)
        if cfg.kl_coef and not cfg.kl_in_reward:
            kl_BT = kl_penalty(logp, mb.extras["ref_logprobs"], cfg.kl_estimator)
            loss = loss + cfg.kl_coef * agg_loss(kl_BT, mask, *agg)
            metrics["actor/kl_loss"] = masked_mean(kl_BT.detach(), mask)
        return loss, metrics

    return loss_fn


def value_loss_fn(cfg: AlgorithmConfig, max_new_tokens: int):
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
            _denominator(mb, cfg.loss_agg, max_new_tokens),
            max_new_tokens,
        )
        return loss, {"critic/clip_frac": clip_frac}

    return loss_fn
