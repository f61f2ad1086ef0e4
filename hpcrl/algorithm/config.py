"""Config owned by the RL algorithms: the RL stage's estimator, losses, KL and schedule (AlgorithmConfig).
The offline stages' sections live with their kinds (hpcrl.experiment.kinds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from hpcrl.config.ranges import Count, EveryNSteps, Fraction, NonNegative, Positive, Range, Steps


@dataclass(kw_only=True)
class AlgorithmConfig:
    """The RL algorithm the driver runs (stage: rl)."""

    name: Literal["grpo", "ppo", "remax", "rloo", "reinforce_pp", "reinforce_pp_baseline", "distill"] = "grpo"
    """Advantage estimator / algorithm (hpcrl.algorithm.registry.ALGORITHMS says what each needs). ppo uses a
    critic with GAE; distill is on-policy distillation from `teacher_path`."""
    steps: Steps = 40
    """Training iterations (one rollout batch + its updates each)."""
    prompts_per_step: Count = 16
    """Prompts per iteration; each is sampled `rollout.samples_per_prompt` times."""
    ppo_epochs: Annotated[int, Range(ge=1, le=1000)] = 1
    """Passes over each rollout batch."""
    clip_ratio: Positive = 0.2
    """PPO-clip epsilon: the ratio stays in [1 - eps, 1 + eps] unless clip_ratio_low/high say otherwise."""
    clip_ratio_low: Annotated[float, Range(gt=0, lt=1)] | None = None
    """Lower epsilon (null: clip_ratio)."""
    clip_ratio_high: Positive | None = None
    """Upper epsilon (null: clip_ratio). DAPO's clip-higher uses 0.28 with low 0.2."""
    clip_ratio_c: Annotated[float, Range(gt=1)] | None = 3.0
    """Dual-clip PPO's c > 1: the loss of a token with a negative advantage is at most -A * c (verl's
    default 3.0); null turns the dual clip off."""
    tis_cap: Annotated[float, Range(ge=1)] | None = 2.0
    """Truncated importance sampling: the policy loss of each token is weighted by
    min(pi_old / pi_rollout, tis_cap), correcting for the rollout engine's numerics (verl #2953; the
    paper's C = 2). Every hpcrl engine returns log-probs, so it is on by default; null turns it off."""
    value_clip: Positive = 0.2
    """Clipped value loss range (PPO)."""
    gamma: Fraction = 1.0
    """Discount (GAE / REINFORCE++)."""
    lam: Fraction = 0.95
    """GAE lambda."""
    norm_adv_by_std: bool = True
    """GRPO: divide group-centred rewards by the group std (False = Dr.GRPO style)."""
    kl_coef: NonNegative = 0.0
    """Weight of the KL to the reference policy; 0 skips the reference model."""
    kl_estimator: Literal["k1", "k2", "k3", "abs", "mse"] = "k3"
    """KL estimator (Schulman's k1, k2, k3; verl's abs; mse is k2 under verl's name)."""
    kl_in_reward: bool = False
    """True: KL is a per-token reward penalty (PPO style); False: a loss term (GRPO style)."""
    entropy_coef: NonNegative = 0.0
    """Entropy bonus weight."""
    loss_agg: Literal[
        "token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"
    ] = "token_mean"
    """How per-token losses reduce to a scalar (hpcrl.rl.losses.agg_loss). Dr. GRPO is
    seq_mean_token_sum_norm (normalised by rollout.max_new_tokens) with norm_adv_by_std: false."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (Yu et al. 2025, §3.2): drop prompt groups whose rewards are all equal
    (zero advantage, no gradient) and sample more prompts until prompts_per_step groups are kept."""
    max_gen_batches: Annotated[int, Range(ge=1, le=1000)] = 4
    """Dynamic sampling: at most this many rollout batches per step; the step trains on the groups kept
    so far when they run out."""
    overlong_buffer_len: Annotated[int, Range(ge=0, le=1 << 24)] = 0
    """DAPO's soft overlong punishment (§3.4): responses longer than rollout.max_new_tokens minus this
    buffer lose up to overlong_penalty_factor, linearly over the buffer; 0 = off."""
    overlong_penalty_factor: NonNegative = 1.0
    """The penalty at the full generation budget."""
    teacher_path: str | None = None
    """On-policy distillation (name: distill): the frozen teacher, an HF directory (config.json, weights
    and the student's vocabulary), loaded like the reference model (same pool and layout, any size that
    layout divides); it scores every token the student samples."""
    teacher_tensor: Count | None = None
    """name: distill: the teacher's tensor-parallel size (null: the policy's parallel.tensor); with
    teacher_pipeline it runs at a layout of its own on the policy's ranks, data-parallel over the rest
    (t_T * p_T must divide parallel.tensor * parallel.pipeline * parallel.data)."""
    teacher_pipeline: Count | None = None
    """name: distill: the teacher's pipeline-parallel size (null: the policy's parallel.pipeline)."""
    distill_task_coef: NonNegative = 0.0
    """name: distill: weight of the task reward (each response's score, on every token) added to the
    per-token reverse-KL advantage (hpcrl.rl.advantages.reverse_kl_advantages); 0 = pure distillation."""
    distill_whiten: bool = True
    """name: distill: whiten the per-token advantages over the batch's response tokens (subtract their
    mean, a baseline: E_y~pi[grad log pi(y)] = 0 leaves the gradient's expectation unchanged; divide by
    their std). Off: the raw reverse KL as the advantage (Thinking Machines' recipe)."""
    eval_every: EveryNSteps = 5
    """Evaluate held-out reward every this many steps (0: never)."""
