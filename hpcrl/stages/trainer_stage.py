"""The run of a stage that trains one model on a dataset (SFT, offline DPO / IPO / KTO, reward model):
its rank preamble, step loop, evaluations, checkpoints and headline, around the stage's own driver.

A driver builds its trainer(s) and data from the config and offers `step(i)` (one update, its metrics)
and `evaluate(i)` (held-out metrics of the model as it is); its `trained.trainer` is checkpointed as
its stage kind's model_prefix ("actor.", the reward model's "reward."; `hpcrl ckpt export --prefix`
reads it) and its `sampler`'s cursor with it, so resume=auto continues from `latest` with every
step logged once; a completed run exports that model to `<run_dir>/hf` (hpcrl.stages.export).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from hpcrl.ckpt.state import seed_rngs
from hpcrl.config.schema import range_problems
from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.stage_kinds import stage_of
from hpcrl.lifecycle import Lifecycle
from hpcrl.stages.loop import run_steps
from hpcrl.stages.rank import enter_rank, step_sleep_s
from hpcrl.stages.stateful import DataCursorState
from hpcrl.stages.tracking import metrics_logger
from hpcrl.train.batch import TrainBatch
from hpcrl.train.workers import TrainerWorker


class TrainerStageDriver(Protocol):
    @property
    def trained(self) -> TrainerWorker:
        """The worker of the model the stage trains (the policy, or the reward model)."""

    sampler: object
    """The training rows in resumable order (a PromptSampler)."""

    def step(self, step: int) -> dict[str, float]: ...

    def evaluate(self, step: int) -> dict[str, float]: ...


def train_timing(start: float, batch: TrainBatch) -> dict[str, float]:
    """time/train_s (since `start`, from the perf_counter) and tps/train (the batch's tokens per second)
    of one step."""
    seconds = time.perf_counter() - start
    return {"time/train_s": seconds, "tps/train": int(batch.attention_mask_BT.sum()) / seconds}


def stage_problems(cfg: ExperimentConfig, world_size: int) -> list[Problem]:
    """Everything wrong with the config before any rank builds a model: its numbers' ranges (alone when
    one is out), its stage's rules (the same ones `expand` ran, hpcrl.experiment.stage_kinds) and the
    layout against this world."""
    problems = range_problems(cfg) or stage_of(cfg).rules(cfg)
    try:
        layout = ParallelLayout.from_config(cfg.parallel)
        layout.check_world(world_size)
        layout.check_model(cfg.model)
    except ConfigError as err:
        problems.extend(err.problems)
    return problems


def run_trainer_stage(
    cfg: ExperimentConfig,
    run_dir: Path,
    lifecycle: Lifecycle | None,
    build_driver: Callable[[ExperimentConfig], TrainerStageDriver],
    eval_every: int,
) -> dict:
    """Run the stage on this rank; returns the last step's metrics (with the final held-out ones)."""
    kind = stage_of(cfg)
    cfg, rank, _ = enter_rank(cfg, run_dir, stage_problems)
    run_dir = Path(run_dir)
    seed_rngs(cfg.seed)
    start = time.perf_counter()
    driver = build_driver(cfg)
    steps = operator.attrgetter(kind.steps_key)(cfg)
    logger = metrics_logger(cfg, run_dir, steps, is_main=rank == 0, headline=kind.headline)

    def step(index: int) -> dict:
        # held-out metrics of the model before this step's update (step 0: as initialised)
        metrics = driver.evaluate(index) if eval_every and index % eval_every == 0 else {}
        return metrics | driver.step(index)

    final = driver.evaluate if eval_every else None  # the final model, logged as step `steps`
    parts = ({kind.model_prefix: driver.trained.trainer}, [DataCursorState(driver)])
    last, plot = run_steps(
        cfg, run_dir, parts, logger, step, final, start,
        steps=steps, sleep_s=step_sleep_s(), lifecycle=lifecycle, export_prefix=kind.model_prefix,
    )  # fmt: skip
    if rank == 0 and plot is not None:
        print(f"hpcrl: {kind.headline.label} curve {plot}", flush=True)
    return last
