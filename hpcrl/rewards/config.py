"""Config owned by the reward side."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from hpcrl.config.ranges import Count, Range


@dataclass(kw_only=True)
class RewardConfig:
    """Which reward scores a response."""

    name: str | None = "task"
    """Registry key: task (the built-in task's own rule), exact_match, gsm8k (number after ####), format,
    model. null: none by name (then `terms` or `function` says what scores)."""
    model_path: str | None = None
    """HF sequence-classification model directory (num_labels 1, e.g. an `rm` stage's `hf/` export), for
    name=model (or the `model` term)."""
    model_backend: Literal["hf", "megatron"] = "hf"
    """Where the reward model runs. hf: transformers on every rank, scoring the decoded text. megatron: a
    megatron-core GPTModel with its scalar head (loaded from `model_path`'s score.weight), a frozen model
    role on the training ranks (colocated) or the split placement's models pool, beside the reference and
    critic, at the policy's layout or its own (model_tensor, model_pipeline; hpcrl.rl.roles); not on the
    async placement, whose rollout pool scores."""
    model_tensor: Count | None = None
    """model_backend megatron: the reward model's tensor-parallel size (null: the policy's
    parallel.tensor); with model_pipeline it runs at a layout of its own on its pool's ranks,
    data-parallel over the rest (t_R * p_R must divide the pool's ranks, the policy's t * p * d)."""
    model_pipeline: Count | None = None
    """model_backend megatron: the reward model's pipeline-parallel size (null: parallel.pipeline)."""
    function: str | None = None
    """A reward of your own, replacing `name`: 'path/to/file.py:function' (relative to the template that
    sets it) or 'package.module:function', called per batch as function(prompts, responses, answers,
    extras) -> one number, or one dict with a number under 'score' (its other numbers are logged as
    reward_fn/<key>), per response (hpcrl.rewards.function). Checked at expand without running it."""
    terms: dict[str, float] | None = None
    """A weighted mix instead of one reward, e.g. {task: 1.0, model: 0.5, function: 0.1, format: 0.2}:
    each key a source - a rule (`name`'s registry: task, exact_match, gsm8k, format), `model` (the reward
    model at `model_path`) or `function` (`function`) - and the score is sum(weight * term). Each term's
    batch mean is logged as reward_term/<source>; a term that raises or is not finite fails its sample
    (nan_policy), naming the term. Replaces `name` (leave it at its default); `model_path` and
    `function` are read only as their terms (hpcrl.rewards.terms)."""
    timeout_s: Annotated[float, Range(gt=0, le=86400)] = 60.0
    """reward.function: seconds one call may take; a slower call is killed with every process it started
    and fails its batch (nan_policy decides)."""
    nan_policy: str = "error"
    """What a NaN / raising reward does: error (stop) or skip (drop the sample, counted and logged)."""
