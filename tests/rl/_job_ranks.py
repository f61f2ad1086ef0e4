"""Rank functions for the RL job tests (module level, so spawned ranks can import them)."""

from __future__ import annotations

import json
from pathlib import Path

from hpcrl.experiment.resolve import resolve

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "grpo_tiny.yaml"


def tiny_config(template: Path = TEMPLATE, **overrides):
    """The template's config with dotted-key overrides (checked like command-line overrides)."""
    base = {"logging.tensorboard": False, "logging.progress": False}
    return resolve(template, {**base, **overrides}).elements[0].config


def heldout_curve(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["reward/heldout"]) for r in rows if r.get("reward/heldout") is not None]


def run_job(rank: int, world: int, cfg, run_dir: str) -> dict:
    from hpcrl.rl.job import main

    return main(cfg, Path(run_dir))


def run_algorithms(rank: int, world: int, configs: list, run_root: str) -> dict:
    """Run several short jobs one after another in the same ranks; return each one's last metrics."""
    from hpcrl.rl.job import main

    return {cfg.algorithm.name: main(cfg, Path(run_root) / cfg.algorithm.name) for cfg in configs}


def run_named(rank: int, world: int, named: list, run_root: str) -> None:
    """Run several (name, config) jobs one after another in the same ranks, each in run_root/name."""
    from hpcrl.rl.job import main

    for name, cfg in named:
        main(cfg, Path(run_root) / name)


def run_with_flaky_reward(rank: int, world: int, cfg, run_dir: str) -> dict:
    """exact_match replaced by a rule that raises on every response ending in an even digit."""
    from hpcrl.rewards import rule_rewards as rules
    from hpcrl.rl.job import main

    def flaky(prompt: str, response: str, answer: str) -> float:
        if response and response[-1] in "02468":
            raise ValueError("even tail")
        return float(response == answer)

    rules.RULES["exact_match"] = flaky
    return main(cfg, Path(run_dir))


def run_twice_with_resume(rank: int, world: int, cfg_first, cfg_full, run_dir: str) -> tuple[dict, dict]:
    """A run of 4 steps that checkpoints, then the same run asked for 6 steps resumes at step 4."""
    from hpcrl.rl.job import main

    first = main(cfg_first, Path(run_dir))
    second = main(cfg_full, Path(run_dir))
    return first, second


def run_uninterrupted(rank: int, world: int, cfg, run_dir: str) -> dict:
    from hpcrl.rl.job import main

    return main(cfg, Path(run_dir))
