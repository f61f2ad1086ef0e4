"""The algorithm registry and AlgorithmConfig's rules: one owner, checked at expand/submit and on ranks."""

import subprocess
import sys
import typing
from dataclasses import fields

import pytest

from hpcrl.algorithm.config import AlgorithmConfig
from hpcrl.algorithm.registry import ALGORITHMS, algorithm_problems
from hpcrl.config.schema import range_problems
from hpcrl.experiment.kinds.dpo import DPOConfig


def test_the_config_names_exactly_the_registered_algorithms():
    [name_field] = [f for f in fields(AlgorithmConfig) if f.name == "name"]
    hints = typing.get_type_hints(AlgorithmConfig)
    assert set(typing.get_args(hints[name_field.name])) == set(ALGORITHMS)


def test_a_good_config_has_no_problem():
    assert algorithm_problems(AlgorithmConfig(), samples_per_prompt=8, max_new_tokens=3) == []


@pytest.mark.parametrize(
    ("overrides", "samples", "key"),
    [
        ({"name": "rloo"}, 1, "rollout.samples_per_prompt"),
        ({"name": "reinforce_pp_baseline"}, 1, "rollout.samples_per_prompt"),
        ({"kl_in_reward": True}, 4, "algorithm.kl_in_reward"),
        ({"kl_coef": -0.1}, 4, "algorithm.kl_coef"),
        ({"clip_ratio_low": 1.0}, 4, "algorithm.clip_ratio_low"),
        ({"clip_ratio": 0.0, "clip_ratio_high": 0.2}, 4, "algorithm.clip_ratio"),
        ({"clip_ratio": 1.5}, 4, "algorithm.clip_ratio_low"),
        ({"clip_ratio_c": float("nan")}, 4, "algorithm.clip_ratio_c"),
        ({"steps": 10**30}, 4, "algorithm.steps"),
        ({"clip_ratio_high": -0.1}, 4, "algorithm.clip_ratio_high"),
        ({"clip_ratio_c": 1.0}, 4, "algorithm.clip_ratio_c"),
        ({"tis_cap": 0.9}, 4, "algorithm.tis_cap"),
        ({"name": "ppo", "dynamic_sampling": True}, 1, "algorithm.dynamic_sampling"),
        ({"max_gen_batches": 0}, 4, "algorithm.max_gen_batches"),
        ({"overlong_buffer_len": 3}, 4, "algorithm.overlong_buffer_len"),
        ({"overlong_buffer_len": -1}, 4, "algorithm.overlong_buffer_len"),
        ({"overlong_penalty_factor": -1.0}, 4, "algorithm.overlong_penalty_factor"),
        ({"steps": 0}, 4, "algorithm.steps"),
    ],
)
def test_each_rule_names_its_key(overrides, samples, key):
    """A number outside its field's range (hpcrl.config.ranges), else a rule across fields."""
    algo = AlgorithmConfig(**overrides)
    problems = range_problems(algo, "algorithm.") or algorithm_problems(
        algo, samples_per_prompt=samples, max_new_tokens=3
    )
    assert [p.key for p in problems] == [key], problems


def _expand(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", "expand", "templates/grpo_tiny.yaml", *overrides],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_rules_fire_at_expand_through_the_cli():
    """Every rule runs before anything is submitted: `hpcrl expand` exits 2 and names each key; a number
    outside its range is refused as the value is read, like a wrong type."""
    proc = _expand("--rollout.samples_per_prompt", "1", "--algorithm.kl_in_reward", "true")
    assert proc.returncode == 2, proc.stderr
    for key in ("rollout.samples_per_prompt", "algorithm.kl_in_reward"):
        assert f"command line:{key}:" in proc.stderr
    proc = _expand("--algorithm.clip_ratio_c", "0.5", "--algorithm.steps", "1e30")
    assert proc.returncode == 2, proc.stderr
    assert "command line:algorithm.clip_ratio_c: out of range: must be > 1, got 0.5" in proc.stderr
    assert "command line:algorithm.steps: " in proc.stderr


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"steps": 0}, "dpo.steps"),
        ({"pairs_per_step": 0}, "dpo.pairs_per_step"),
        ({"beta": 0.0}, "dpo.beta"),
        ({"beta": float("inf")}, "dpo.beta"),
        ({"beta": float("nan")}, "dpo.beta"),
        ({"eval_every": -1}, "dpo.eval_every"),
    ],
)
def test_each_dpo_range_names_its_key(overrides, key):
    assert range_problems(DPOConfig(), "dpo.") == []
    assert [p.key for p in range_problems(DPOConfig(**overrides), "dpo.")] == [key]
