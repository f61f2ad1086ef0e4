"""The driver of a stage that trains one model by one loss on sampled rows and scores it on held-out
rows: SFT's policy on demonstrations (hpcrl.posttrain.sft), the reward model on preference pairs
(hpcrl.posttrain.rm). Per step: sample `rows_per_step` rows (resumable cursor), build their batch, one
update of `trained` on `loss_fn`; `evaluate` gives `heldout_metrics` of the held-out batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hpcrl.data.cursor import PromptSampler
from hpcrl.stages.trainer_stage import train_timing
from hpcrl.train.batch import TrainBatch
from hpcrl.train.pipeline import LossFn
from hpcrl.train.workers import TrainerWorker


@dataclass
class SupervisedDriver:
    metric_prefix: str
    """Namespace of the step's metrics: `<prefix>/loss` and the loss function's own."""
    rows_per_step: int
    trained: TrainerWorker
    """The model the stage trains, checkpoints and exports (hpcrl.stages.trainer_stage)."""
    loss_fn: LossFn
    sampler: PromptSampler[Any]
    """Training rows in resumable shuffled order."""
    make_batch: Callable[[list[Any]], TrainBatch]
    heldout: TrainBatch
    heldout_metrics: Callable[[TrainBatch], dict[str, float]]
    """Metrics of `trained` as it is on a batch of held-out rows."""

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        batch = self.make_batch(self.sampler.next_batch(self.rows_per_step))
        stats = self.trained.update(batch, self.loss_fn)
        loss = stats.pop("loss")
        return {"step": step, f"{self.metric_prefix}/loss": loss, **stats, **train_timing(start, batch)}

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        return {"step": step, **self.heldout_metrics(self.heldout)}
