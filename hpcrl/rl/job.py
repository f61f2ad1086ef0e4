"""The RL job: `main(cfg, run_dir)` runs on every rank after torch.distributed is initialised.

It checks the whole config first (every problem at once, before any rank builds a model), then
composes the workers — megatron actor (+ reference, + critic), reshard engine, rollout engine, reward
— and runs the driver, logging per-step metrics on rank 0 to <run_dir>/metrics.jsonl (+ TensorBoard,
progress bar, reward.png).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from hpcrl.algorithm.registry import algorithm_problems
from hpcrl.ckpt.state import seed_rngs
from hpcrl.config.schema import range_problems
from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.kinds.rl import context_problems
from hpcrl.experiment.stage_kinds import stage_of
from hpcrl.lifecycle import Lifecycle
from hpcrl.rl.assemble import build_job, placement_problems, rollout_engine_problems, training_world
from hpcrl.rollout.engine_rule import EngineFacts
from hpcrl.stages.loop import run_steps
from hpcrl.stages.rank import enter_rank, step_sleep_s

log = logging.getLogger(__name__)


def config_problems(cfg: ExperimentConfig, world_size: int) -> list[Problem]:
    """Rules across components that only the RL job knows (each Problem names its key), after the
    numbers' ranges (hpcrl.config.ranges: alone when one is out, the rules compute with them)."""
    ranges = range_problems(cfg)
    if ranges:
        return ranges
    algo, rollout = cfg.algorithm, cfg.rollout
    problems: list[Problem] = []
    problems.extend(placement_problems(cfg, world_size))
    problems.extend(algorithm_problems(algo, rollout.samples_per_prompt, rollout.max_new_tokens))
    try:
        layout = ParallelLayout.from_config(cfg.parallel)
        layout.check_world(training_world(cfg, world_size))
        layout.check_model(cfg.model)
    except ConfigError as err:
        problems.extend(err.problems)
        layout = None
    problems.extend(rollout_engine_problems(cfg, EngineFacts.here()))
    problems.extend(context_problems(cfg))
    return problems


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
    parts = (job.trainers, job.states)
    try:
        last, plot = run_steps(
            cfg, run_dir, parts, job.logger, job.driver.step, final, start,
            steps=cfg.algorithm.steps, sleep_s=step_sleep_s(), lifecycle=lifecycle,
            export_prefix=stage_of(cfg).model_prefix,
        )  # fmt: skip
    except BaseException:
        job.close(False)  # a peer may be gone: do not wait for its transfer
        raise
    job.close(True)
    if rank == 0 and plot is not None:
        print(f"hpcrl: reward curve {plot}", flush=True)
    return last
