"""The preamble every stage's entrypoint runs on its rank: its config rules, the resolved model, the run
directory; and the recovery tests' step-sleep knob."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.train.hf_config import with_hf_architecture

STEP_SLEEP_ENV = "HPCRL_STEP_SLEEP_S"
"""Test knob (set it through `cluster.env`): sleep this long after every step, so that recovery tests
get minutes of wall-clock work from the real job at almost no CPU cost. Changes no result."""


def step_sleep_s() -> float:
    """Seconds of the STEP_SLEEP_ENV test knob (0 when unset)."""
    return float(os.environ.get(STEP_SLEEP_ENV, "0") or 0)


def enter_rank(
    cfg: ExperimentConfig, run_dir: Path, problems_of: Callable[[ExperimentConfig, int], list[Problem]]
) -> tuple[ExperimentConfig, int, int]:
    """(config, rank, world) of an entrypoint, after its config rules pass (else ConfigError with all
    problems, before any work); rank 0 creates the run dir and prints where the metrics go.

    The config comes back with its model resolved: the architecture read from `model.hf_path`'s
    config.json where the template left it out (hpcrl.train.hf_config.with_hf_architecture, the same
    function `expand` checks with), so every rule and every builder on the rank sees the model's real
    dimensions, never None."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    cfg = dataclasses.replace(cfg, model=with_hf_architecture(cfg.model))
    problems = problems_of(cfg, world)
    if problems:
        raise ConfigError(problems)
    if rank == 0:
        run_dir = Path(run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        print(f"hpcrl: run dir {run_dir}  metrics -> {run_dir / 'metrics.jsonl'}", flush=True)
    return cfg, rank, world
