"""What each RL algorithm needs from the rest of the job, and the rules about `AlgorithmConfig`.

Torch-free, so the config rules that run at `expand`/`submit` (hpcrl.experiment.rules) and the job's own
check on the ranks (hpcrl.rl.job) read the same registry and the same rule function. The advantage
math itself lives in hpcrl.rl.advantages, keyed by the same names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpcrl.algorithm.config import AlgorithmConfig
from hpcrl.errors import Problem


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    needs_critic: bool = False
    """Trains a value model (GAE)."""
    min_samples_per_prompt: int = 1
    """Group baselines need a group: at least this many responses per prompt."""
    greedy_baseline: bool = False
    """Also generates one greedy response per prompt as the baseline (ReMax)."""
    needs_teacher: bool = False
    """Scores the samples with a frozen teacher (`algorithm.teacher_path`: on-policy distillation)."""


ALGORITHMS: dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        AlgorithmSpec("ppo", needs_critic=True),
        AlgorithmSpec("grpo", min_samples_per_prompt=2),
        AlgorithmSpec("rloo", min_samples_per_prompt=2),
        AlgorithmSpec("remax", greedy_baseline=True),
        AlgorithmSpec("reinforce_pp"),
        AlgorithmSpec("reinforce_pp_baseline", min_samples_per_prompt=2),
        AlgorithmSpec("distill", needs_teacher=True),
    )
}
"""Every algorithm by `AlgorithmConfig.name`."""


def algorithm_problems(algo: AlgorithmConfig, samples_per_prompt: int, max_new_tokens: int) -> list[Problem]:
    """Every problem of the algorithm's settings (and of the rollout settings it depends on)."""
    spec = ALGORITHMS.get(algo.name)
    if spec is None:
        return [
            Problem(f"unknown algorithm {algo.name!r}; known: {sorted(ALGORITHMS)}", key="algorithm.name")
        ]
    rules = _common_rules(algo) + _online_rules(algo, spec, samples_per_prompt, max_new_tokens)
    return [Problem(message, key=key) for key, ok, message in rules if not ok]


def _common_rules(algo: AlgorithmConfig) -> list[tuple[str, bool, str]]:
    return [
        ("algorithm.steps", algo.steps >= 1, f"must be >= 1, got {algo.steps}"),
        (
            "algorithm.prompts_per_step",
            algo.prompts_per_step >= 1,
            f"must be >= 1, got {algo.prompts_per_step}",
        ),
    ]


def _online_rules(algo: AlgorithmConfig, spec: AlgorithmSpec, samples: int, max_new_tokens: int):
    low = algo.clip_ratio if algo.clip_ratio_low is None else algo.clip_ratio_low
    high = algo.clip_ratio if algo.clip_ratio_high is None else algo.clip_ratio_high
    return [
        ("algorithm.ppo_epochs", algo.ppo_epochs >= 1, f"must be >= 1, got {algo.ppo_epochs}"),
        (
            "rollout.samples_per_prompt",
            samples >= spec.min_samples_per_prompt,
            f"{algo.name} needs >= {spec.min_samples_per_prompt} samples per prompt, got {samples}",
        ),
        ("algorithm.clip_ratio_low", 0 < low < 1, f"the lower clip epsilon must be in (0, 1), got {low}"),
        ("algorithm.clip_ratio_high", high > 0, f"the upper clip epsilon must be > 0, got {high}"),
        (
            "algorithm.clip_ratio_c",
            algo.clip_ratio_c is None or algo.clip_ratio_c > 1,
            f"dual-clip c must be > 1 (or null: off), got {algo.clip_ratio_c}",
        ),
        (
            "algorithm.tis_cap",
            algo.tis_cap is None or 1 <= algo.tis_cap < math.inf,
            f"must be a finite number >= 1 (or null: off), got {algo.tis_cap}",
        ),
        ("algorithm.kl_coef", algo.kl_coef >= 0, f"must be >= 0, got {algo.kl_coef}"),
        (
            "algorithm.teacher_path",
            spec.needs_teacher == (algo.teacher_path is not None),
            f"{algo.name} needs a teacher: an HF directory"
            if spec.needs_teacher
            else f"only algorithm.name: distill reads a teacher ({algo.name} would ignore it)",
        ),
        (
            "algorithm.distill_task_coef",
            0 <= algo.distill_task_coef < math.inf and (spec.needs_teacher or algo.distill_task_coef == 0),
            f"must be a finite number >= 0, got {algo.distill_task_coef}"
            if spec.needs_teacher
            else f"only algorithm.name: distill reads it ({algo.name} would ignore it)",
        ),
        (
            "algorithm.kl_in_reward",
            not (algo.kl_in_reward and algo.kl_coef == 0),
            "kl_in_reward needs kl_coef > 0",
        ),
        (
            "algorithm.dynamic_sampling",
            not (algo.dynamic_sampling and samples < 2),
            f"dynamic sampling keeps groups whose rewards differ: needs >= 2 samples per prompt, got {samples}",
        ),
        ("algorithm.max_gen_batches", algo.max_gen_batches >= 1, f"must be >= 1, got {algo.max_gen_batches}"),
        (
            "algorithm.overlong_buffer_len",
            0 <= algo.overlong_buffer_len < max(max_new_tokens, 1),
            f"must be in [0, rollout.max_new_tokens = {max_new_tokens}), got {algo.overlong_buffer_len}",
        ),
        (
            "algorithm.overlong_penalty_factor",
            algo.overlong_penalty_factor >= 0,
            f"must be >= 0, got {algo.overlong_penalty_factor}",
        ),
    ]
