"""The step loop every stage runs: resume, steps, saves and stops when the trigger says so, a final
evaluation, and the logger and checkpointer closed whatever happens (hpcrl.stages.checkpointing)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist

from hpcrl.experiment.config import ExperimentConfig
from hpcrl.lifecycle import Lifecycle
from hpcrl.stages.checkpointing import StageCheckpointing
from hpcrl.stages.export import export_final_model
from hpcrl.stages.stateful import Stateful

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from hpcrl.metrics.logger import MetricsLogger
    from hpcrl.train.trainer import Trainer


def run_steps(
    cfg: ExperimentConfig,
    run_dir: Path,
    ckpt_parts: tuple[dict[str, Trainer], list[Stateful]],
    logger: MetricsLogger,
    step: Callable[[int], dict],
    final: Callable[[int], dict] | None,
    start: float,
    *,
    steps: int,
    sleep_s: float = 0.0,
    lifecycle: Lifecycle | None = None,
    export_prefix: str,
) -> tuple[dict, Path | None]:
    """The step loop of a checkpointed stage (the RL job and DPO share it): resume, `step(i)` for the
    remaining of `steps` steps (each logged once, with time/elapsed_s since `start`; then a `sleep_s` pause, the
    recovery tests' knob hpcrl.stages.rank.STEP_SLEEP_ENV), saves and a stop for requeue when the trigger says
    so, then `final(steps)` (e.g. the final evaluation) unless stopped; the logger and checkpointer are
    closed (save_on_exit) whatever happens; a completed run then exports the `export_prefix` model (the
    stage's own: RL's actor, the reward model's "reward.") to `<run_dir>/hf` (hpcrl.stages.export). `ckpt_parts` = (trainers by prefix, the stage's other
    Statefuls: its data cursor, ...); `lifecycle`: the run's signals (None: an inert one). Returns (the last metrics, merged with the final ones; the reward plot or None)."""
    ckpt: StageCheckpointing | None = None
    completed, last, stopped, in_step, ended = 0, {}, False, False, False
    try:  # a refused resume (another run's checkpoint) closes the logger too
        ckpt = StageCheckpointing(cfg, run_dir, *ckpt_parts, lifecycle=lifecycle)
        completed = ckpt.resume()
        for index in range(completed, steps):
            in_step = True  # until step() returns, the trainers' state may be half updated
            metrics = step(index)
            in_step = False
            if sleep_s:
                time.sleep(sleep_s)
            metrics["time/elapsed_s"] = time.perf_counter() - start
            logger.log(metrics)
            last = metrics
            completed = index + 1
            stopped = ckpt.after_step(index)
            logger.settle(ckpt.committed_steps)  # the trackers get what no resume can redo
            if stopped:
                break
        if final is not None and not stopped:
            metrics = final(steps)
            metrics["time/elapsed_s"] = time.perf_counter() - start
            logger.log(metrics)
            last = {**last, **metrics}
        ended = completed == steps and not stopped
    finally:
        plot = logger.close()
        try:
            if ckpt is not None:
                ckpt.close(completed, between_steps=not in_step)
                logger.settle(ckpt.committed_steps)
        finally:
            _close_trackers(logger, ended)
    if completed == steps and not stopped and cfg.checkpoint.export_hf and _is_rank_zero():
        # rank 0 reads the committed checkpoint, so it need not hold the model (split placement)
        exported = export_final_model(ckpt.checkpointer.root, Path(run_dir), export_prefix, steps)
        if exported is not None:
            print(f"hpcrl: HF export {exported}", flush=True)
    return last, plot


def _close_trackers(logger: MetricsLogger, ended: bool) -> None:
    """A run that ended sends every record (its final evaluation included); else the steps after the last
    commit stay unsent: the next attempt redoes them."""
    unsent = logger.close_trackers(ended)
    if unsent:
        log.warning(
            "%d records after the last checkpoint not sent to the trackers: a resume redoes them", unsent
        )


def _is_rank_zero() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0
