"""Reward sources and their weighted mix (`reward.terms`), and every rule about the reward section.

A source is a rule of the registry (hpcrl.rewards.rule_rewards: exact_match, gsm8k, format; `task`, the built-in
task's own rule), `model` (an HF reward model, `reward.model_path`) or `function` (the user's,
`reward.function`). `reward.name` picks one source; `reward.terms` mixes several:

    r(x, y) = sum_k w_k * r_k(x, y)

each term scored on the whole batch by its own scorer. A sample fails (raised, or not finite) when any
term fails on it, and the failure names the term; `reward.nan_policy` decides as for one reward.
`reward_problems` holds the section's rules: `expand` runs them (hpcrl.experiment.rules) and so does
`build_scorer` on the ranks, so a run never starts with a reward it cannot build.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from hpcrl.data.config import DataConfig
from hpcrl.errors import ConfigError, Problem, short
from hpcrl.rewards.config import RewardConfig
from hpcrl.rewards.rule_rewards import RULES
from hpcrl.train.config import ModelConfig
from hpcrl.train.hf_config import ModelDimsUnavailable, read_config_json

MODEL, FUNCTION, TASK = "model", "function", "task"
NAMES = (TASK, *RULES, MODEL)
"""What `reward.name` may be."""
SOURCES = (*NAMES, FUNCTION)
"""Every reward source, the keys of `reward.terms`."""
NAN_POLICIES = ("error", "skip")
TERM_METRIC = "reward_term/"
"""The prefix of each term's batch mean among a mix's metrics: `reward_term/<source>`."""


class TermFailed(ValueError):
    """A term of a mix raised or returned a non-finite value on a sample."""


def sources_of(reward: RewardConfig) -> dict[str, float]:
    """The weighted sources this section scores with: its terms, or its one reward with weight 1."""
    if reward.terms is not None:
        return dict(reward.terms)
    return {FUNCTION if reward.function is not None else reward.name: 1.0}


def megatron_reward_model(reward: RewardConfig, policy: ModelConfig) -> ModelConfig | None:
    """The reward model's ModelConfig when it runs as a megatron model role (reward.model_backend
    megatron; its architecture from `model_path`'s config.json, in the policy's dtype), else None.
    The ranks (hpcrl.rl.roles), the expand rules and the memory planner read it from here."""
    if reward.model_backend != "megatron" or MODEL not in sources_of(reward) or not reward.model_path:
        return None
    return ModelConfig(hf_path=reward.model_path, dtype=policy.dtype)


def reward_problems(reward: RewardConfig, data: DataConfig, environment: bool = False) -> list[Problem]:
    """Every rule of the reward section that reads no file (reward.function's source is checked by
    hpcrl.rewards.function.function_problems, the model directory by the ranks that load it).
    `environment`: a multi-turn environment rewards the episodes (rollout.env), so the section may name
    no reward (reward.name null: the environment's rewards alone)."""
    out = []
    if reward.nan_policy not in NAN_POLICIES:
        message = f"{short(reward.nan_policy)} is not one of {NAN_POLICIES}"
        out.append(Problem(message, key="reward.nan_policy"))
    chosen = _terms_problems(reward) if reward.terms is not None else _name_problems(reward, environment)
    out += chosen
    sources = {} if chosen else sources_of(reward)
    if MODEL in sources and not reward.model_path:
        message = "missing required field (the reward model needs a model directory)"
        out.append(Problem(message, key="reward.model_path"))
    if reward.model_path is not None and reward.terms is None and not chosen and MODEL not in sources:
        message = f"only a reward model reads it (reward.name: model, or a model term); {_named(reward)} would ignore it"
        out.append(Problem(message, key="reward.model_path"))
    if reward.model_backend == "megatron" and not chosen and MODEL not in sources:
        message = "megatron runs the reward model, but this reward reads none (name: model, or a model term)"
        out.append(Problem(message, key="reward.model_backend"))
    if TASK in sources and data.source != "builtin":
        message = (
            f"the task reward scores built-in tasks (data.source builtin), not {short(data.source)} rows"
        )
        out.append(Problem(message, key="reward.terms" if reward.terms is not None else "reward.name"))
    return out


def hf_reward_model_problems(reward: RewardConfig) -> list[Problem]:
    """The HF reward model's directory (`reward.model_backend: hf`), when it is readable here: a config.json
    of one label, the score hpcrl.rewards.reward_model reads (transformers makes 2 when config.json says
    nothing). The megatron backend's is checked as a frozen model (hpcrl.experiment.frozen_models); a
    path that exists only on the cluster is left to the ranks."""
    if reward.model_backend != "hf" or not reward.model_path or MODEL not in sources_of(reward):
        return []
    try:
        data = read_config_json(reward.model_path)
    except ModelDimsUnavailable:
        return []
    except ConfigError as err:
        return [
            Problem(f"{p.file}: {p.message}" if p.file else p.message, key="reward.model_path")
            for p in err.problems
        ]
    labels = data.get("id2label")
    count = len(labels) if isinstance(labels, dict) and labels else data.get("num_labels", 2)
    if count != 1:
        file = Path(reward.model_path) / "config.json"
        message = f"{file}: a reward model has one label (a scalar score), this one has {short(count)}"
        return [Problem(message, key="reward.model_path")]
    return []


def _named(reward: RewardConfig) -> str:
    return "reward.function" if reward.function is not None else f"reward.name {reward.name}"


def scores_nothing(reward: RewardConfig) -> bool:
    """reward.name null with no terms and no function: only a multi-turn environment's rewards count."""
    return reward.name is None and reward.terms is None and reward.function is None


def _name_problems(reward: RewardConfig, environment: bool) -> list[Problem]:
    if reward.function is not None:
        if reward.name not in (TASK, None):
            message = f"reward.function replaces reward.name: leave reward.name out (or null), not {short(reward.name)}"
            return [Problem(message, key="reward.name")]
        return []
    if reward.name is None and environment:
        return []
    if reward.name is None:
        message = (
            f"null names no reward: set reward.name (one of {sorted(NAMES)}), reward.terms or reward.function"
        )
        return [Problem(message, key="reward.name")]
    if reward.name not in NAMES:
        return [Problem(f"unknown reward {short(reward.name)}; known: {sorted(NAMES)}", key="reward.name")]
    return []


def _terms_problems(reward: RewardConfig) -> list[Problem]:
    terms = reward.terms or {}
    out = []
    if not terms:
        out.append(Problem("names no term: set `source: weight` pairs, or null", key="reward.terms"))
    for source, weight in terms.items():
        if source not in SOURCES:
            message = f"unknown source {short(source)}; known: {list(SOURCES)}"
            out.append(Problem(message, key="reward.terms"))
        elif isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
            message = f"{source}: the weight must be a finite number, got {short(weight)}"
            out.append(Problem(message, key="reward.terms"))
    if reward.name not in (TASK, None):
        message = (
            f"reward.terms replaces reward.name: leave reward.name out (or null), not {short(reward.name)}"
        )
        out.append(Problem(message, key="reward.name"))
    for source, key, value in ((FUNCTION, "reward.function", reward.function), (MODEL, "reward.model_path", reward.model_path)):  # fmt: skip
        if value is not None and source not in terms:
            message = (
                f"read only as the {source!r} term of reward.terms, which has none (add {source}: <weight>)"
            )
            out.append(Problem(message, key=key))
    if FUNCTION in terms and reward.function is None:
        out.append(Problem("the 'function' term needs reward.function", key="reward.function"))
    return out


class WeightedScorer:
    """A BatchScorer of sum_k w_k * r_k over `terms` (source, weight, scorer); `last_metrics` holds each
    term's batch mean (reward_term/<source>, over the samples it scored) and its scorer's own metrics."""

    def __init__(self, terms: Sequence[tuple[str, float, object]]):
        self.terms = list(terms)
        self.__name__ = " + ".join(f"{w:g}*{source}" for source, w, _ in self.terms)
        self.last_metrics: dict[str, float] = {}

    def __call__(self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list:
        n, totals = len(responses), [0.0] * len(responses)
        failed: list[Exception | None] = [None] * n
        self.last_metrics = {}
        for source, weight, scorer in self.terms:
            values = scorer(prompts, responses, answers)
            if len(values) != n:
                values = [TermFailed(f"returned {len(values)} scores for {n} responses")] * n
            finite = []
            for i, value in enumerate(values):
                bad = isinstance(value, Exception) or not math.isfinite(value)
                if bad and failed[i] is None:
                    cause = (
                        f"raised {type(value).__name__}: {value}"
                        if isinstance(value, Exception)
                        else f"returned {value}"
                    )
                    failed[i] = TermFailed(f"term {source} {cause}")
                elif not bad:
                    totals[i] += weight * float(value)
                    finite.append(float(value))
            if finite:
                self.last_metrics[f"{TERM_METRIC}{source}"] = sum(finite) / len(finite)
            self.last_metrics |= getattr(scorer, "last_metrics", {})
        return [err if err is not None else total for err, total in zip(failed, totals, strict=True)]
