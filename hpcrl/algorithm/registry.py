"""What each RL algorithm needs from the rest of the job, and the rules about `AlgorithmConfig`.

Torch-free, so the config rules that run at `expand`/`submit` (hpcrl.experiment.rules) and the job's own
check on the ranks (hpcrl.rl.job) read the same registry and the same rule function. The advantage
math itself lives in hpcrl.rl.advantages, keyed by the same names.
"""

from __future__ import annotations

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
    """Every problem of the algorithm's settings that ties them to each other, to the algorithm's needs
    and to the rollout settings (each number's own range is its field's, hpcrl.config.ranges)."""
    spec = ALGORITHMS.get(algo.name)
    if spec is None:
        return [
            Problem(f"unknown algorithm {algo.name!r}; known: {sorted(ALGORITHMS)}", key="algorithm.name")
        ]
    rules = _rules(algo, spec, samples_per_prompt, max_new_tokens)
    return [Problem(message, key=key) for key, ok, message in rules if not ok]


def _rules(algo: AlgorithmConfig, spec: AlgorithmSpec, samples: int, max_new_tokens: int):
    low = algo.clip_ratio if algo.clip_ratio_low is None else algo.clip_ratio_low
    return [
        (
            "rollout.samples_per_prompt",
            samples >= spec.min_samples_per_prompt,
            f"{algo.name} needs >= {spec.min_samples_per_prompt} samples per prompt, got {samples}",
        ),
        ("algorithm.clip_ratio_low", 0 < low < 1, f"the lower clip epsilon must be in (0, 1), got {low}"),
        (
            "algorithm.teacher_path",
            spec.needs_teacher == (algo.teacher_path is not None),
            f"{algo.name} needs a teacher: an HF directory"
            if spec.needs_teacher
            else f"only algorithm.name: distill reads a teacher ({algo.name} would ignore it)",
        ),
        (
            "algorithm.distill_task_coef",
            spec.needs_teacher or algo.distill_task_coef == 0,
            f"only algorithm.name: distill reads it ({algo.name} would ignore it)",
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
        (
            "algorithm.overlong_buffer_len",
            algo.overlong_buffer_len < max(max_new_tokens, 1),
            f"must be below rollout.max_new_tokens = {max_new_tokens}, got {algo.overlong_buffer_len}",
        ),
    ]
