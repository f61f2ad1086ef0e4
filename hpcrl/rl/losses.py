"""Policy, value, KL and entropy losses of RL: small pure functions over masked token tensors (the
preference losses are hpcrl.posttrain.preference_losses).

Shape legend: B = sequences, T = response tokens (right padded). `mask_BT` is 1.0 on real tokens.
Aggregation takes an optional global denominator so that gradient accumulation over micro-batches and
data-parallel ranks gives the same gradient as one big batch (1x4 == 4x1): each micro-batch divides by
the token (or sequence) count of the WHOLE batch, and the partial gradients sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

LossAgg = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3", "abs", "mse"]


LOG_RATIO_CLAMP = 20.0
"""|log pi/pi_old| and |log pi_ref/pi| are clamped to this before exp (verl core_algos: +-20), so one
extreme token cannot overflow exp to inf and turn the loss into inf or nan."""
K3_CLAMP = 10.0
"""The k3 KL estimate per token is clamped to [-10, 10] (verl's "low_var_kl")."""


def masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x where mask is set, else 0: a nan or inf at a masked (padding) position never enters the sum
    (x * mask would give nan there)."""
    return torch.where(mask.bool(), x, torch.zeros_like(x))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum over the mask of x / sum(mask); 0 when the mask is empty."""
    return masked(x, mask).sum() / mask.sum().clamp(min=1)


def agg_loss(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: LossAgg,
    denominator: float | None = None,
    norm_length: int | None = None,
):
    """Reduce per-token losses to a scalar.

    - token_mean: sum_{b,t} l m / N_tokens (every token weighs the same; DAPO §3.3 "token-level loss").
    - seq_mean_token_sum: sum_b (sum_t l m) / N_seqs (no length normalisation).
    - seq_mean_token_mean: sum_b (sum_t l m / |y_b|) / N_seqs (the original GRPO objective, eq. 3).
    - seq_mean_token_sum_norm: sum_b (sum_t l m) / (N_seqs * L), L a constant length, the generation
      budget (Liu et al. 2025, Dr. GRPO §3.1 and its code: "divide by a constant, not by |y_b|").
      verl divides the batch sum by the padded width instead; a constant keeps every step's scale equal.
    `denominator` replaces N_tokens / N_seqs (times L) by the count of the whole (global) batch;
    `norm_length` is L (default: the padded width T).
    """
    if mode == "token_mean":
        denom = mask_BT.sum().clamp(min=1) if denominator is None else denominator
        return masked(loss_BT, mask_BT).sum() / denom
    seq_sums_B = masked(loss_BT, mask_BT).sum(dim=1)
    default_denom = loss_BT.shape[0]
    if mode == "seq_mean_token_mean":
        seq_sums_B = seq_sums_B / mask_BT.sum(dim=1).clamp(min=1)
    elif mode == "seq_mean_token_sum_norm":
        default_denom *= norm_length or loss_BT.shape[1]
    elif mode != "seq_mean_token_sum":
        raise ValueError(f"unknown loss aggregation {mode!r}")
    denom = default_denom if denominator is None else denominator
    return seq_sums_B.sum() / denom


@dataclass(frozen=True)
class ClipRange:
    """The PPO trust region: ratio kept in [1 - low, 1 + high], and (dual-clip) the loss of a negative
    advantage capped at -A * dual_c."""

    low: float = 0.2
    high: float = 0.2
    """DAPO's clip-higher (Yu et al. 2025, §3.1): high > low (0.28 vs 0.2) lets unlikely tokens with a
    positive advantage grow faster, which keeps entropy from collapsing."""
    dual_c: float | None = 3.0
    """Dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in MOBA Games", §3.2 eq. 5): c > 1;
    None = off. verl's default, 3.0."""


@dataclass
class PolicyLossStats:
    clip_fraction: float
    """Share of real tokens whose ratio left [1-low, 1+high] on the side that the max() picked."""
    dual_clip_fraction: float
    """Share of real tokens with A < 0 whose loss the dual clip capped at -A * c."""
    approx_kl: float
    """k3 estimate of KL(old || new) over real tokens (how far this update moved): with samples from
    pi_old and r = pi/pi_old, k3 = (r - 1) - log r (Schulman 2020)."""


def ppo_clip_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip: ClipRange,
    agg: LossAgg = "token_mean",
    denominator: float | None = None,
    norm_length: int | None = None,
    weights_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """PPO-clip (Schulman et al. 2017, "Proximal Policy Optimization", eq. 7), as a loss to minimise,
    with asymmetric bounds (DAPO §3.1) and the dual clip (Ye et al. 2020, eq. 5) as verl's
    compute_policy_loss_vanilla:
      rho_t = exp(clamp(logp_t - logp_old_t, +-20))        (finite even at a padded garbage log-ratio)
      l_t   = max(-A_t rho_t, -A_t clip(rho_t, 1 - low, 1 + high))
      l_t   = min(l_t, -A_t c)  where A_t < 0               (dual clip, when c is set)
      l_t  *= w_t                                           (importance weights, e.g. TIS; no gradient)
    """
    log_ratio_BT = torch.clamp(logp_BT - old_logp_BT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio_BT = torch.exp(log_ratio_BT)
    unclipped_BT = -advantages_BT * ratio_BT
    clipped_BT = -advantages_BT * torch.clamp(ratio_BT, 1.0 - clip.low, 1.0 + clip.high)
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    dual_capped_BT = torch.zeros_like(loss_BT, dtype=torch.bool)
    if clip.dual_c is not None:
        cap_BT = -advantages_BT * clip.dual_c
        dual_capped_BT = (advantages_BT < 0) & (loss_BT > cap_BT)
        loss_BT = torch.where(advantages_BT < 0, torch.minimum(loss_BT, cap_BT), loss_BT)
    if weights_BT is not None:
        loss_BT = loss_BT * weights_BT.detach()
    with torch.no_grad():
        stats = PolicyLossStats(
            clip_fraction=masked_mean((clipped_BT > unclipped_BT).float(), mask_BT).item(),
            dual_clip_fraction=masked_mean(dual_capped_BT.float(), mask_BT).item(),
            approx_kl=masked_mean(ratio_BT - 1 - log_ratio_BT, mask_BT).item(),
        )
    return agg_loss(loss_BT, mask_BT, agg, denominator, norm_length), stats


@dataclass
class ImportanceStats:
    weight_mean: float
    """Mean truncated weight over real tokens."""
    clip_fraction: float
    """Share of real tokens whose weight the cap truncated."""


def truncated_is_weights(
    old_logp_BT: torch.Tensor, rollout_logp_BT: torch.Tensor, mask_BT: torch.Tensor, cap: float
) -> tuple[torch.Tensor, ImportanceStats]:
    """Truncated importance sampling (TIS) for the rollout-vs-trainer mismatch (Yao et al. 2025, "Your
    Efficient RL Framework Secretly Brings You Off-Policy RL Training", eq. 3; verl #2953):
      w_t = min(pi_old(y_t) / pi_rollout(y_t), C)
    The samples come from the rollout engine's numerics, the gradient from the trainer's; w corrects the
    policy gradient for that gap, truncated at C to bound its variance. 1.0 on padding."""
    log_w_BT = torch.clamp(old_logp_BT - rollout_logp_BT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    raw_BT = torch.where(mask_BT.bool(), torch.exp(log_w_BT), torch.ones_like(log_w_BT))
    weights_BT = torch.clamp(raw_BT, max=cap)
    stats = ImportanceStats(
        weight_mean=masked_mean(weights_BT, mask_BT).item(),
        clip_fraction=masked_mean((raw_BT > cap).float(), mask_BT).item(),
    )
    return weights_BT, stats


def clipped_value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip: float,
    agg: LossAgg = "token_mean",
    denominator: float | None = None,
    norm_length: int | None = None,
) -> tuple[torch.Tensor, float]:
    """Clipped value loss (Schulman et al. 2017 as implemented in OpenAI baselines ppo2; cleanrl ppo.py):
    l_t = 1/2 max((V_t - R_t)^2, (V_old_t + clip(V_t - V_old_t, -c, c) - R_t)^2).
    Returns (loss, value clip fraction).
    """
    clipped_BT = old_values_BT + torch.clamp(values_BT - old_values_BT, -clip, clip)
    sq_unclipped = (values_BT - returns_BT) ** 2
    sq_clipped = (clipped_BT - returns_BT) ** 2
    loss_BT = 0.5 * torch.maximum(sq_unclipped, sq_clipped)
    with torch.no_grad():
        clip_fraction = masked_mean((sq_clipped > sq_unclipped).float(), mask_BT).item()
    return agg_loss(loss_BT, mask_BT, agg, denominator, norm_length), clip_fraction


def kl_penalty(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating KL
    Divergence", http://joschu.net/blog/kl-approx.html), with log r = logp_ref - logp (verl's names):
    - k1 = -log r (unbiased, high variance, can be negative);
    - abs = |log r| (verl's "abs");
    - k2 = mse = 1/2 (log r)^2 (biased, low variance; verl's "mse");
    - k3 = (r - 1) - log r (unbiased, always >= 0; the GRPO paper's eq. 4 KL term), computed with log r
      clamped to +-20 and the result to [-10, 10] as verl's low_var_kl (finite for any input).
    """
    log_r = ref_logp_BT - logp_BT
    if estimator == "k1":
        return -log_r
    if estimator == "abs":
        return log_r.abs()
    if estimator in ("k2", "mse"):
        return 0.5 * log_r.square()
    if estimator == "k3":
        log_r = torch.clamp(log_r, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return torch.clamp(torch.exp(log_r) - 1 - log_r, -K3_CLAMP, K3_CLAMP)
    raise ValueError(f"unknown KL estimator {estimator!r}; known: k1, k2, k3, abs, mse")


def entropy_from_logits(logits_BTV: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution per position: H = logsumexp(z) - sum softmax(z) z."""
    probs_BTV = torch.softmax(logits_BTV, dim=-1)
    return torch.logsumexp(logits_BTV, dim=-1) - (probs_BTV * logits_BTV).sum(dim=-1)


def entropy_bonus(
    entropy_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    coef: float,
    agg: LossAgg = "token_mean",
    denominator: float | None = None,
    norm_length: int | None = None,
) -> torch.Tensor:
    """Entropy bonus as a loss term: -coef * agg(H_t) (Mnih et al. 2016, A3C §4; PPO eq. 9 "c2 S")."""
    return -coef * agg_loss(entropy_BT, mask_BT, agg, denominator, norm_length)
