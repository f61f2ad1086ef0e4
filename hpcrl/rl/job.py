"""The RL job: `main(cfg, run_dir)` runs on every rank after torch.distributed is initialised.

It checks the whole config first (every problem at once, before any rank builds a model), then
composes the workers — megatron actor (+ reference, + critic), reshard engine, rollout engine, reward
— and runs the driver, logging per-step metrics on rank 0 to <run_dir>/metrics.jsonl (+ TensorBoard,
progress bar, reward.png).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from hpcrl.algorithm.registry import ALGORITHMS, algorithm_problems
from hpcrl.ckpt.state import seed_rngs
from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.lifecycle import Lifecycle
from hpcrl.rl.assemble import build_job, placement_problems, rollout_engine_problems, training_world
from hpcrl.rl.checkpointing import rl_trainers, run_steps
from hpcrl.rollout.engine_rule import EngineFacts
from hpcrl.train.hf_config import with_hf_architecture

log = logging.getLogger(__name__)

STEP_SLEEP_ENV = "HPCRL_STEP_SLEEP_S"
"""Test knob (set it through `cluster.env`): sleep this long after every step, so that recovery tests
get minutes of wall-clock work from the real job at almost no CPU cost. Changes no result."""


def config_problems(cfg: ExperimentConfig, world_size: int) -> list[Problem]:
    """Rules across components that only the RL job knows (each Problem names its key)."""

    algo, rollout = cfg.algorithm, cfg.rollout
    problems: list[Problem] = []
    if not ALGORITHMS.get(algo.name, ALGORITHMS["grpo"]).online:
        problems.append(
            Problem(
                f"{algo.name!r} is offline: set entrypoint: hpcrl.rl.dpo:main (see templates/dpo_tiny.yaml)",
                key="algorithm.name",
            )
        )
    problems.extend(placement_problems(cfg, world_size))
    problems.extend(algorithm_problems(algo, rollout.samples_per_prompt, rollout.max_new_tokens))
    if rollout.max_new_tokens < 1:
        problems.append(Problem(f"must be >= 1, got {rollout.max_new_tokens}", key="rollout.max_new_tokens"))
    try:
        layout = ParallelLayout.from_config(cfg.parallel)
        layout.check_world(training_world(cfg, world_size))
        layout.check_model(cfg.model)
    except ConfigError as err:
        problems.extend(err.problems)
        layout = None
    problems.extend(rollout_engine_problems(cfg, EngineFacts.here()))
    needed = cfg.data.max_prompt_length + rollout.max_new_tokens
    if cfg.model.hf_path is None and needed > cfg.model.max_position_embeddings:
        problems.append(
            Problem(
                f"max_prompt_length + max_new_tokens = {needed} exceeds the model's context "
                f"{cfg.model.max_position_embeddings}",
                key="model.max_position_embeddings",
            )
        )
    return problems


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


def main(cfg: ExperimentConfig, run_dir: Path, lifecycle: Lifecycle | None = None) -> dict:
    """Run the configured RL job on this rank; returns the last step's metrics (every rank).
    `lifecycle`: the wrapper's (hpcrl.launcher.element), whose signals the save trigger reads; a direct
    call (tests) gets an inert one."""

    cfg, rank, world = enter_rank(cfg, run_dir, config_problems)
    run_dir = Path(run_dir)
    seed_rngs(cfg.seed)
    start = time.perf_counter()
    job = build_job(cfg, run_dir, rank, world)
    final = job.driver.final_evaluation if cfg.algorithm.eval_every else None
    parts = (rl_trainers(job.driver), job.driver)
    try:
        last, plot = run_steps(
            cfg, run_dir, parts, job.logger, job.driver.step, final, start, step_sleep_s(),
            lifecycle=lifecycle, extra=job.extra,
        )  # fmt: skip
    except BaseException:
        job.close(False)  # a peer may be gone: do not wait for its transfer
        raise
    job.close(True)
    if rank == 0 and plot is not None:
        print(f"hpcrl: reward curve {plot}", flush=True)
    return last
