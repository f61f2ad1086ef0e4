"""Offline preference losses (stage: dpo, `dpo.loss_type`): DPO's sigmoid, IPO and KTO; and the reward
model's Bradley-Terry loss (stage: rm).

Inputs are per-sequence log-ratios against the frozen reference, rho(y|x) = log pi(y|x) - log ref(y|x),
with log pi(y|x) the sum of the response tokens' log-probs. Shape legend: N pairs, B rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DPOStats:
    reward_accuracy: float
    """Share of pairs whose implicit reward prefers the chosen response."""
    reward_margin: float
    """Mean implicit reward margin (the loss's own score: beta * (rho_w - rho_l) for sigmoid, the
    per-token log-ratio margin h for ipo)."""


def dpo_loss(
    policy_chosen_logp_B: torch.Tensor,
    policy_rejected_logp_B: torch.Tensor,
    ref_chosen_logp_B: torch.Tensor,
    ref_rejected_logp_B: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, DPOStats]:
    """DPO sigmoid loss (Rafailov et al. 2023, "Direct Preference Optimization", eq. 7):
    L = -log sigmoid(beta [(log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))]), averaged over
    pairs; inputs are summed sequence log-probs.
    """
    margin_N = beta * (
        (policy_chosen_logp_B - ref_chosen_logp_B) - (policy_rejected_logp_B - ref_rejected_logp_B)
    )
    return -F.logsigmoid(margin_N).mean(), _stats(margin_N)


def ipo_loss(
    chosen_logratio_N: torch.Tensor,
    rejected_logratio_N: torch.Tensor,
    chosen_tokens_N: torch.Tensor,
    rejected_tokens_N: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, DPOStats]:
    """IPO (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human
    Preferences", eq. 17, tau = beta), on per-token log-ratios as TRL computes it (the normalisation its
    authors confirmed): h = rho_w / |y_w| - rho_l / |y_l|,  L = mean_N (h - 1 / (2 beta))^2.
    The squared loss pulls the margin to 1/(2 beta) rather than to infinity (no overfitting to
    deterministic preferences)."""
    h_N = chosen_logratio_N / chosen_tokens_N.clamp(min=1) - rejected_logratio_N / rejected_tokens_N.clamp(
        min=1
    )
    return ((h_N - 1 / (2 * beta)) ** 2).mean(), _stats(h_N)


def _stats(margin_N: torch.Tensor) -> DPOStats:
    with torch.no_grad():
        return DPOStats((margin_N > 0).float().mean().item(), margin_N.mean().item())


def kto_reference_point(policy_kl_logp_B: torch.Tensor, ref_kl_logp_B: torch.Tensor) -> torch.Tensor:
    """KTO's reference point z0 (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic
    Optimization", §4.1): z0 = max(0, mean_B [log pi(y'|x) - log ref(y'|x)]), a biased estimate of
    KL(pi || ref) from mismatched pairs (x_i, y_{i-1}) of the same batch, with no gradient (as the paper
    and TRL use it)."""
    return (policy_kl_logp_B - ref_kl_logp_B).mean().clamp(min=0).detach()


def kto_losses_B(
    logratio_B: torch.Tensor,
    desirable_B: torch.Tensor,
    z0: torch.Tensor,
    beta: float,
    desirable_weight: float,
    undesirable_weight: float,
) -> torch.Tensor:
    """Per-row KTO loss (Ethayarajh et al. 2024, eq. 8): with r = rho(y|x),
      desirable:    lambda_D (1 - sigmoid(beta (r - z0)))
      undesirable:  lambda_U (1 - sigmoid(beta (z0 - r)))
    i.e. lambda_y - v(x, y); the loss is their mean over all rows (TRL's KTOTrainer)."""
    desirable_B = desirable_B.bool()
    value_B = torch.where(desirable_B, beta * (logratio_B - z0), beta * (z0 - logratio_B))
    weight_B = torch.where(desirable_B, desirable_weight, undesirable_weight).to(logratio_B.dtype)
    return weight_B * (1 - torch.sigmoid(value_B))


def bradley_terry_loss(
    chosen_score_N: torch.Tensor, rejected_score_N: torch.Tensor
) -> tuple[torch.Tensor, DPOStats]:
    """The reward model's pairwise loss (Bradley & Terry 1952; InstructGPT, Ouyang et al. 2022, eq. 1):
    L = -mean_N log sigmoid(r(x, y_w) - r(x, y_l)), the scores r read at each sequence's last token. Stats:
    pairwise accuracy (r_w > r_l) and the mean margin r_w - r_l."""
    margin_N = chosen_score_N - rejected_score_N
    return -F.logsigmoid(margin_N).mean(), _stats(margin_N)
