"""Score a batch of responses and apply the NaN / exception policy.

nan_policy `error`: the first sample whose reward raises or is not finite stops the run with a
RewardError naming the sample, the reward and the cause. `skip`: such samples are dropped from the
batch (`keep_B` False), counted in `num_skipped` and logged; they never reach an update.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from hpcrl.data.config import DataConfig
from hpcrl.errors import ConfigError
from hpcrl.rewards.config import RewardConfig
from hpcrl.rewards.function import FunctionScorer
from hpcrl.rewards.reward_model import RewardModelScorer
from hpcrl.rewards.rule_rewards import RULES, task_rule
from hpcrl.rewards.terms import (
    FUNCTION,
    MODEL,
    TASK,
    WeightedScorer,
    reward_problems,
    scores_nothing,
    sources_of,
)

log = logging.getLogger(__name__)

BatchScorer = Callable[[Sequence[str], Sequence[str], Sequence[str]], list[float | Exception]]
"""(prompts, responses, answers) -> one score per response; an Exception in place of a score that raised."""


class RewardError(RuntimeError):
    """A reward raised or returned a non-finite value under nan_policy=error."""


@dataclass
class RewardResult:
    scores_B: torch.Tensor
    """Rewards (0.0 where skipped)."""
    keep_B: torch.Tensor
    """False for skipped samples."""
    num_skipped: int
    reasons: list[str]
    metrics: dict[str, float] = field(default_factory=dict)
    """The scorer's own batch metrics by name: a reward function's extra numbers (reward_fn/<key>), each
    term's mean of a mix (reward_term/<source>)."""


def rule_batch_scorer(rule: Callable[[str, str, str], float]) -> BatchScorer:
    """Apply a per-sample rule; a raising sample yields its exception, handled by the policy."""

    def score(prompts, responses, answers):
        out = []
        for p, r, a in zip(prompts, responses, answers, strict=True):
            try:
                out.append(float(rule(p, r, a)))
            except Exception as err:  # a user reward may raise anything; the policy decides
                out.append(err)
        return out

    score.__name__ = getattr(rule, "__name__", "rule")
    return score


def build_scorer(
    reward: RewardConfig, data: DataConfig, *, model: BatchScorer | None = None, environment: bool = False
) -> BatchScorer:
    """The batch scorer of the reward section: one source, or the weighted mix of `reward.terms`. The
    reward model is `model` when the job runs it as a model role (reward.model_backend megatron), else
    transformers' loads its weights here. The section's rules run first (hpcrl.rewards.terms).
    `environment`: episodes of a multi-turn environment are scored (their last turn); a section that
    names no reward then scores 0 (the environment's rewards alone)."""
    problems = reward_problems(reward, data, environment)
    if problems:
        raise ConfigError(problems)
    if scores_nothing(reward):
        return _no_reward
    if reward.terms is None:
        [source] = sources_of(reward)
        return _source_scorer(source, reward, data, model)
    return WeightedScorer([(s, w, _source_scorer(s, reward, data, model)) for s, w in reward.terms.items()])


def _no_reward(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:  # noqa: ARG001
    return [0.0] * len(responses)


_no_reward.__name__ = "none (the environment's rewards alone)"


def task_rule_scorer(reward: RewardConfig, data: DataConfig) -> BatchScorer | None:
    """The built-in task's own rule, when the reward scores by something else (a reward model, another
    rule, a mix, a function): what held-out evaluation also reports, as the ground truth that reward
    stands in for. None for file data (no rule) and when the reward is the task rule itself (terms of
    weight 0 are watched, not scored: `{task: 1.0, model: 0.0}` is the rule)."""
    weighted = {source: weight for source, weight in sources_of(reward).items() if weight != 0}
    if data.source != "builtin" or weighted == {TASK: 1.0}:
        return None
    return rule_batch_scorer(task_rule(data.task))


def _source_scorer(
    source: str, reward: RewardConfig, data: DataConfig, model: BatchScorer | None
) -> BatchScorer:
    if source == FUNCTION:
        return FunctionScorer(reward.function, reward.timeout_s)
    if source == MODEL:
        return model if model is not None else RewardModelScorer(reward.model_path)
    if source == TASK:
        return rule_batch_scorer(task_rule(data.task))
    return rule_batch_scorer(RULES[source])


def score_batch(
    scorer: BatchScorer,
    prompts: Sequence[str],
    responses: Sequence[str],
    answers: Sequence[str],
    nan_policy: str,
) -> RewardResult:
    values = scorer(prompts, responses, answers)
    if len(values) != len(responses):
        raise RewardError(
            f"reward {_name(scorer)} returned {len(values)} scores for {len(responses)} responses"
        )
    keep, reasons, scores = [], [], []
    for i, value in enumerate(values):
        raised = isinstance(value, Exception)
        bad = raised or not math.isfinite(value)
        if bad:
            cause = f"raised {type(value).__name__}: {value}" if raised else f"returned {value}"
            reason = f"sample {i} (response {responses[i][:40]!r}): reward {_name(scorer)} {cause}"
            if nan_policy == "error":
                raise RewardError(reason + " (reward.nan_policy=error; use skip to drop such samples)")
            reasons.append(reason)
            log.warning("skipping %s", reason)
        keep.append(not bad)
        scores.append(0.0 if bad else float(value))
    metrics = dict(getattr(scorer, "last_metrics", {}))
    scores_B = torch.tensor(scores, dtype=torch.float32)
    return RewardResult(scores_B, torch.tensor(keep), len(reasons), reasons, metrics)


def _name(scorer: BatchScorer) -> str:
    return getattr(scorer, "__name__", type(scorer).__name__)
