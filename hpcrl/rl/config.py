"""Config owned by the algorithm: estimator, losses, KL, schedule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class AlgorithmConfig:
    """The RL (or offline DPO) algorithm the driver runs."""

    name: Literal["grpo", "ppo", "remax", "rloo", "reinforce_pp", "dpo"] = "grpo"
    """Advantage estimator / algorithm. ppo uses a critic with GAE."""
    steps: int = 40
    """Training iterations (one rollout batch + its updates each)."""
    prompts_per_step: int = 16
    """Prompts per iteration; each is sampled `rollout.samples_per_prompt` times."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    clip_ratio: float = 0.2
    """PPO-clip epsilon."""
    value_clip: float = 0.2
    """Clipped value loss range (PPO)."""
    gamma: float = 1.0
    """Discount (GAE / REINFORCE++)."""
    lam: float = 0.95
    """GAE lambda."""
    norm_adv_by_std: bool = True
    """GRPO: divide group-centred rewards by the group std (False = Dr.GRPO style)."""
    kl_coef: float = 0.0
    """Weight of the KL to the reference policy; 0 skips the reference model."""
    kl_estimator: Literal["k1", "k3"] = "k3"
    """KL estimator (Schulman's k1 / k3)."""
    kl_in_reward: bool = False
    """True: KL is a per-token reward penalty (PPO style); False: a loss term (GRPO style)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight."""
    loss_agg: Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"] = "token_mean"
    """How per-token losses reduce to a scalar."""
    dpo_beta: float = 0.1
    """DPO temperature beta."""
    placement: Literal["colocated", "split"] = "colocated"
    """colocated: actor/ref/critic on all ranks, reshard between phases; split: disjoint rank pools."""
    eval_every: int = 5
    """Evaluate held-out reward every this many steps (0: never)."""
