"""Advantage estimators: small pure functions plus a registry keyed by `AlgorithmConfig.name`.

Shape legend: B = sequences in the batch (prompts x samples), T = response tokens (right padded).
`mask_BT` is 1.0 on real response tokens and 0.0 on padding. Outcome-reward estimators (GRPO, RLOO,
ReMax) give every token of a response the same advantage; GAE and REINFORCE++ work on per-token rewards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hpcrl.algorithm.config import AlgorithmConfig
from hpcrl.rl.losses import masked_mean


@dataclass(kw_only=True)
class AdvantageInputs:
    """Everything an estimator may read; each uses only what its algorithm needs."""

    scores_B: torch.Tensor
    """Outcome reward per sequence."""
    token_rewards_BT: torch.Tensor
    """Per-token rewards: the outcome on the last real token, minus any KL penalty."""
    mask_BT: torch.Tensor
    """1.0 on real response tokens."""
    group_ids_B: torch.Tensor
    """Which prompt each sequence answers (GRPO / RLOO groups)."""
    values_BT: torch.Tensor | None = None
    """Critic values V(s_t) (PPO / GAE)."""
    baseline_scores_B: torch.Tensor | None = None
    """Reward of the greedy response of the same prompt (ReMax)."""
    logprobs_BT: torch.Tensor | None = None
    """The student's (actor's) log-probs of its sampled tokens (distill)."""
    teacher_logprobs_BT: torch.Tensor | None = None
    """The frozen teacher's log-probs of the same tokens (distill)."""
    task_coef: float = AlgorithmConfig.distill_task_coef
    """distill: the task score's weight on every token."""
    distill_whiten: bool = AlgorithmConfig.distill_whiten
    """distill: whiten the per-token advantages over the batch."""
    gamma: float = AlgorithmConfig.gamma
    lam: float = AlgorithmConfig.lam
    norm_adv_by_std: bool = AlgorithmConfig.norm_adv_by_std


@dataclass(kw_only=True)
class AdvantageOutput:
    advantages_BT: torch.Tensor
    returns_BT: torch.Tensor
    """Targets of the value loss (PPO); for critic-free estimators a copy of the advantages."""


def masked_whiten(x_BT: torch.Tensor, mask_BT: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries (unbiased variance); padding stays 0."""
    mean = masked_mean(x_BT, mask_BT)
    centered = (x_BT - mean) * mask_BT
    count = mask_BT.sum()
    var = (centered**2).sum() / (count - 1).clamp(min=1)
    return centered * torch.rsqrt(var + eps) * mask_BT


def outcome_to_token_rewards(
    scores_B: torch.Tensor, mask_BT: torch.Tensor, env_rewards_BT: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token rewards that sum to each sequence's score: a multi-turn episode's environment rewards
    where they were earned (`env_rewards_BT`: on the last token of each turn, hpcrl.rl.episodes), the
    rest of the score (the outcome; the reward section's score and penalties) on the last real token -
    the last where the mask is 1, which an episode's observations (mask 0) may follow. 0 elsewhere."""
    T = mask_BT.shape[1]
    has_tokens = mask_BT.sum(dim=1) > 0
    last_B = T - 1 - mask_BT.flip(1).argmax(dim=1)
    rest_B = scores_B if env_rewards_BT is None else scores_B - env_rewards_BT.sum(dim=1)
    rewards_BT = torch.zeros_like(mask_BT, dtype=scores_B.dtype)
    rows = torch.arange(mask_BT.shape[0])[has_tokens]
    rewards_BT[rows, last_B[has_tokens]] = rest_B[has_tokens]
    return rewards_BT if env_rewards_BT is None else rewards_BT + env_rewards_BT.to(rewards_BT) * mask_BT


def kl_shaped_rewards(
    token_rewards_BT: torch.Tensor, mask_BT: torch.Tensor, kl_BT: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL in the reward (`algorithm.kl_in_reward`; Ouyang et al. 2022, InstructGPT eq. 2; verl's
    apply_kl_penalty): token rewards r_t = r_t^task − β·KL_t (r^task: `outcome_to_token_rewards`), and
    the sequence score every outcome-only estimator (GRPO, RLOO, ReMax) reads is their sum,
    score − β·Σ_t KL_t (verl's compute_advantage passes token_level_rewards.sum(-1) to them), so the
    penalty reaches every estimator. Returns (scores_B, token_rewards_BT); padding and an episode's
    observations carry no KL."""
    shaped_BT = token_rewards_BT - kl_coef * kl_BT * mask_BT
    return shaped_BT.sum(dim=1), shaped_BT


def discounted_returns(token_rewards_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over the masked tokens (returns are 0 where the mask is 0). A masked-out
    token is skipped, not a stop: an episode's observation between two turns passes turn 2's return
    back to turn 1 (verl's multi-turn masks do the same); right padding has nothing after it."""
    returns_BT = torch.zeros_like(token_rewards_BT)
    running_B = torch.zeros_like(token_rewards_BT[:, 0])
    for t in reversed(range(token_rewards_BT.shape[1])):
        m_B = mask_BT[:, t]
        running_B = (token_rewards_BT[:, t] + gamma * running_B) * m_B + running_B * (1 - m_B)
        returns_BT[:, t] = running_B * m_B
    return returns_BT


def gae(
    token_rewards_BT: torch.Tensor, values_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, "High-Dimensional Continuous Control
    Using GAE", eq. 16): delta_t = r_t + gamma V(s_{t+1}) - V(s_t), A_t = sum_l (gamma lam)^l delta_{t+l}.

    V after the last real token is 0 (the episode ends). Returns (advantages_BT, returns_BT = A + V),
    both 0 where the mask is 0. A masked-out token is skipped: the next real token's value and GAE pass
    through it, so an episode's observation tokens join turn 1 to turn 2 (s_{t+1} of turn 1's last token
    is turn 2's first; verl's compute_gae_advantage_return does the same). Not whitened; `ppo_advantages`
    whitens.
    """
    advantages_BT = torch.zeros_like(token_rewards_BT)
    last_gae_B = torch.zeros_like(token_rewards_BT[:, 0])
    next_value_B = torch.zeros_like(token_rewards_BT[:, 0])
    for t in reversed(range(token_rewards_BT.shape[1])):
        m_B = mask_BT[:, t]
        delta_B = token_rewards_BT[:, t] + gamma * next_value_B - values_BT[:, t]
        last_gae_B = (delta_B + gamma * lam * last_gae_B) * m_B + last_gae_B * (1 - m_B)
        advantages_BT[:, t] = last_gae_B * m_B
        # A padded position passes the next real value through unchanged (right padding: stays 0).
        next_value_B = values_BT[:, t] * m_B + next_value_B * (1 - m_B)
    returns_BT = (advantages_BT + values_BT) * mask_BT
    return advantages_BT, returns_BT


def _group_stats(scores_B: torch.Tensor, group_ids_B: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-sequence mean, unbiased std and size of its group."""
    _, inverse_B = torch.unique(group_ids_B, return_inverse=True)
    num_groups = int(inverse_B.max()) + 1
    size_G = torch.zeros(num_groups, dtype=scores_B.dtype).index_add_(0, inverse_B, torch.ones_like(scores_B))
    sum_G = torch.zeros(num_groups, dtype=scores_B.dtype).index_add_(0, inverse_B, scores_B)
    mean_G = sum_G / size_G
    sq_G = torch.zeros(num_groups, dtype=scores_B.dtype).index_add_(
        0, inverse_B, (scores_B - mean_G[inverse_B]) ** 2
    )
    std_G = torch.sqrt(sq_G / (size_G - 1).clamp(min=1))
    return mean_G[inverse_B], std_G[inverse_B], size_G[inverse_B]


def grpo(
    scores_B: torch.Tensor,
    group_ids_B: torch.Tensor,
    mask_BT: torch.Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantage (Shao et al. 2024, DeepSeekMath, §4.1.2 "outcome supervision"):
    A_i = (r_i - mean(r_group)) / (std(r_group) + eps), broadcast to every token of response i.

    `norm_by_std=False` drops the division (Liu et al. 2025, "Understanding R1-Zero-Like Training",
    Dr. GRPO §3.1). std is the unbiased sample std (as verl); a group of one gets advantage 0.
    """
    mean_B, std_B, size_B = _group_stats(scores_B, group_ids_B)
    adv_B = scores_B - mean_B
    if norm_by_std:
        adv_B = adv_B / (std_B + eps)
    adv_B = torch.where(size_B > 1, adv_B, torch.zeros_like(adv_B))
    return adv_B[:, None] * mask_BT


def rloo(scores_B: torch.Tensor, group_ids_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics", §3.2; Kool et al. 2019):
    A_i = r_i - 1/(k-1) sum_{j != i} r_j = k/(k-1) (r_i - mean(r_group)) for a group of k samples.

    Needs k >= 2 samples per prompt: a smaller group raises ValueError.
    """
    mean_B, _, size_B = _group_stats(scores_B, group_ids_B)
    if bool((size_B < 2).any()):
        bad = group_ids_B[size_B < 2].unique().tolist()
        raise ValueError(f"RLOO needs >= 2 samples per prompt; groups {bad} have 1")
    adv_B = size_B / (size_B - 1) * (scores_B - mean_B)
    return adv_B[:, None] * mask_BT


def remax(scores_B: torch.Tensor, baseline_scores_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """ReMax (Li et al. 2024, "ReMax", Algorithm 1): A_i = r(x, y_i) - r(x, y_greedy), the reward of
    the greedy response to the same prompt as the baseline; broadcast to every token."""
    return (scores_B - baseline_scores_B)[:, None] * mask_BT


def reinforce_pp(token_rewards_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, "REINFORCE++", §3): A_t = sum_{k>=t} gamma^{k-t} r_k (token rewards include
    the per-token KL penalty), then normalised over the whole global batch: (A - mean) / std."""
    returns_BT = discounted_returns(token_rewards_BT, mask_BT, gamma)
    return masked_whiten(returns_BT, mask_BT)


def reinforce_pp_baseline(
    scores_B: torch.Tensor, group_ids_B: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025, "REINFORCE++", §3.2 "with baseline"; verl's
    compute_reinforce_plus_plus_baseline_outcome_advantage): the group mean as a per-prompt baseline,
    then whitening over the whole global batch instead of GRPO's per-group std:
      A_i = r_i - mean(r_group),  A <- (A - mean_batch(A)) / std_batch(A), on every token of response i."""
    mean_B, _, _ = _group_stats(scores_B, group_ids_B)
    return masked_whiten((scores_B - mean_B)[:, None] * mask_BT, mask_BT)


def reverse_kl_advantages(
    logprobs_BT: torch.Tensor,
    teacher_logprobs_BT: torch.Tensor,
    scores_B: torch.Tensor,
    mask_BT: torch.Tensor,
    task_coef: float,
) -> torch.Tensor:
    """On-policy distillation (Agarwal et al. 2024, "On-Policy Distillation of Language Models", GKD
    with λ = 1 and the reverse KL; Lu & Thinking Machines Lab 2025, "On-Policy Distillation"; the Qwen3
    technical report's strong-to-weak distillation): the student samples y ~ π_θ and every sampled token
    is rewarded by the teacher,
      A_t = -(log π_θ(y_t | y_<t) - log π_T(y_t | y_<t)) + c · r(x, y),
    the negative per-token reverse KL (its single-sample k1 estimate) with discount 0 — each token's own
    term, as Thinking Machines' recipe — plus the task score r weighted by c (`distill_task_coef`) on every
    token. Minimising -A_t · log π_θ(y_t) over on-policy samples descends the reverse KL
    KL(π_θ ‖ π_T) token by token. Returned raw (its scale is the KL itself, zero once the student matches
    the teacher); the `distill` estimator whitens it over the batch unless `distill_whiten` is off."""
    return (teacher_logprobs_BT - logprobs_BT + task_coef * scores_B[:, None]) * mask_BT


# --- registry: AlgorithmConfig.name -> estimator over AdvantageInputs ---------------------------------


def _ppo(inp: AdvantageInputs) -> AdvantageOutput:
    if inp.values_BT is None:
        raise ValueError("ppo (GAE) needs critic values: values_BT is None")
    adv_BT, ret_BT = gae(inp.token_rewards_BT, inp.values_BT, inp.mask_BT, inp.gamma, inp.lam)
    return AdvantageOutput(advantages_BT=masked_whiten(adv_BT, inp.mask_BT), returns_BT=ret_BT)


def _grpo(inp: AdvantageInputs) -> AdvantageOutput:
    adv_BT = grpo(inp.scores_B, inp.group_ids_B, inp.mask_BT, inp.norm_adv_by_std)
    return AdvantageOutput(advantages_BT=adv_BT, returns_BT=adv_BT)


def _rloo(inp: AdvantageInputs) -> AdvantageOutput:
    adv_BT = rloo(inp.scores_B, inp.group_ids_B, inp.mask_BT)
    return AdvantageOutput(advantages_BT=adv_BT, returns_BT=adv_BT)


def _remax(inp: AdvantageInputs) -> AdvantageOutput:
    if inp.baseline_scores_B is None:
        raise ValueError("remax needs the greedy baseline rewards: baseline_scores_B is None")
    adv_BT = remax(inp.scores_B, inp.baseline_scores_B, inp.mask_BT)
    return AdvantageOutput(advantages_BT=adv_BT, returns_BT=adv_BT)


def _reinforce_pp(inp: AdvantageInputs) -> AdvantageOutput:
    adv_BT = reinforce_pp(inp.token_rewards_BT, inp.mask_BT, inp.gamma)
    return AdvantageOutput(advantages_BT=adv_BT, returns_BT=adv_BT)


def _reinforce_pp_baseline(inp: AdvantageInputs) -> AdvantageOutput:
    adv_BT = reinforce_pp_baseline(inp.scores_B, inp.group_ids_B, inp.mask_BT)
    return AdvantageOutput(advantages_BT=adv_BT, returns_BT=adv_BT)


def _distill(inp: AdvantageInputs) -> AdvantageOutput:
    if inp.logprobs_BT is None or inp.teacher_logprobs_BT is None:
        raise ValueError("distill needs the student's and the teacher's log-probs")
    adv_BT = reverse_kl_advantages(
        inp.logprobs_BT, inp.teacher_logprobs_BT, inp.scores_B, inp.mask_BT, inp.task_coef
    )
    if inp.distill_whiten:
        adv_BT = masked_whiten(adv_BT, inp.mask_BT)
    return AdvantageOutput(advantages_BT=adv_BT, returns_BT=adv_BT)


ESTIMATORS: dict[str, Callable[[AdvantageInputs], AdvantageOutput]] = {
    "ppo": _ppo,
    "grpo": _grpo,
    "rloo": _rloo,
    "remax": _remax,
    "reinforce_pp": _reinforce_pp,
    "reinforce_pp_baseline": _reinforce_pp_baseline,
    "distill": _distill,
}
"""The estimators of hpcrl.algorithm.registry.ALGORITHMS by name (offline DPO is its own stage,
hpcrl.posttrain.dpo, with no estimator)."""


def compute_advantages(name: str, inp: AdvantageInputs) -> AdvantageOutput:
    try:
        estimator = ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ESTIMATORS)}") from None
    return estimator(inp)
