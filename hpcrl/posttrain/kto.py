"""KTO (stage: dpo, `dpo.loss_type: kto`): a policy learns from unpaired desirable / undesirable responses.

Kahneman-Tversky Optimisation (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic
Optimization"). Per step:
  1. sample 2 x `dpo.pairs_per_step` unpaired rows (x_i, y_i, desirable_i) (a pair is two rows: its
     chosen desirable, its rejected not; hpcrl.data.preference.unpair);
  2. the reference point z0 = max(0, mean_i [log pi(y_{i-1}|x_i) - log ref(y_{i-1}|x_i)]) over mismatched
     rows, each prompt with the previous row's completion (TRL's cyclic shift), without gradient
     (hpcrl.posttrain.preference_losses.kto_reference_point);
  3. one update on mean_i lambda_{y_i} (1 - sigmoid(beta * s_i (r_i - z0))), r_i = log pi(y_i|x_i) -
     log ref(y_i|x_i), s_i = +1 for desirable rows and -1 for undesirable ones (eq. 8).
z0 comes from a no-grad forward of the pre-update policy: with one update per step the parameters are
those of the loss's forward, so this equals TRL's in-forward, detached estimate.
Metrics: dpo/loss, dpo/kl (z0), dpo/accuracy (share of rows on their label's side of z0),
dpo/chosen_reward and dpo/rejected_reward (mean beta * r of desirable / undesirable rows); held-out: when
the held-out rows are pairs, the pair metrics every preference loss reports (dpo/heldout_accuracy: the
implicit reward prefers the chosen response), plus dpo/heldout_loss (KTO's, on the held-out rows).
Shape legend: B rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hpcrl.data.cursor import DataCursor, PromptSampler
from hpcrl.data.preference import PreferencePair, UnpairedRow, unpair
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.posttrain.preference_losses import kto_losses_B, kto_reference_point
from hpcrl.posttrain.preference_setup import PreferenceSetup, RowWorker
from hpcrl.stages.trainer_stage import train_timing
from hpcrl.train.batch import TrainBatch


@dataclass(frozen=True)
class KTOWeights:
    beta: float
    desirable: float
    """lambda_D"""
    undesirable: float
    """lambda_U"""

    def losses_B(self, logratio_B: torch.Tensor, desirable_B: torch.Tensor, z0: torch.Tensor) -> torch.Tensor:
        return kto_losses_B(logratio_B, desirable_B, z0, self.beta, self.desirable, self.undesirable)


def kto_loss_fn(weights: KTOWeights, z0: torch.Tensor):
    """The trainer's loss callback: this micro-batch's share of the mean KTO loss over all rows."""

    def loss_fn(out, mb: TrainBatch) -> tuple[torch.Tensor, dict]:
        logratio_B = (out.logprobs_BT * mb.response_mask_BT).sum(dim=1) - mb.extras["ref_logprobs"]
        desirable_B = mb.extras["desirable"].bool()
        loss = mb.seq_mean(weights.losses_B(logratio_B, desirable_B, z0))
        with torch.no_grad():
            metrics = {
                "dpo/accuracy": ((logratio_B > z0) == desirable_B).float().mean(),
                "dpo/chosen_reward": weights.beta * logratio_B[desirable_B].mean(),
                "dpo/rejected_reward": weights.beta * logratio_B[~desirable_B].mean(),
            }
        return loss, {k: v for k, v in metrics.items() if not torch.isnan(v)}  # a side absent from this mb

    return loss_fn


def mismatched(rows: list[UnpairedRow]) -> tuple[list[str], list[str]]:
    """(prompts, completions) of the KL rows: prompt i with completion i-1, cyclically (TRL)."""
    return [r.prompt for r in rows], [rows[i - 1].completion for i in range(len(rows))]


@dataclass
class KTODriver:
    weights: KTOWeights
    rows_per_step: int
    policy: RowWorker
    reference: RowWorker
    sampler: PromptSampler[UnpairedRow]
    """Training rows in resumable shuffled order."""
    make_batch: Callable[[list[str], list[str]], TrainBatch]
    heldout: list[UnpairedRow]
    heldout_pairs: bool
    """Whether the held-out rows came as pairs (then pair accuracy is reported)."""

    @property
    def trained(self) -> RowWorker:
        """The model the stage trains, checkpoints and exports: the policy (hpcrl.stages.trainer_stage)."""
        return self.policy

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        rows = self.sampler.next_batch(self.rows_per_step)
        z0 = self.reference_point(rows)
        batch = self._batch(rows)
        stats = self.policy.update(batch, kto_loss_fn(self.weights, z0))
        return {
            "step": step,
            "dpo/loss": stats.pop("loss"),
            "dpo/kl": float(z0),
            **stats,
            **train_timing(start, batch),
        }

    @torch.no_grad()
    def reference_point(self, rows: list[UnpairedRow]) -> torch.Tensor:
        kl_batch = self.make_batch(*mismatched(rows))
        return kto_reference_point(
            self.policy.sequence_logprobs(kl_batch), self.reference.sequence_logprobs(kl_batch)
        )

    def _batch(self, rows: list[UnpairedRow]) -> TrainBatch:
        batch = self.make_batch([r.prompt for r in rows], [r.completion for r in rows])
        batch.extras["ref_logprobs"] = self.reference.sequence_logprobs(batch)
        batch.extras["desirable"] = torch.tensor([r.desirable for r in rows])
        return batch

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        batch = self._batch(self.heldout)
        logratio_B = self.policy.sequence_logprobs(batch) - batch.extras["ref_logprobs"]
        desirable_B = batch.extras["desirable"]
        z0 = self.reference_point(self.heldout)
        metrics = {"dpo/heldout_loss": float(self.weights.losses_B(logratio_B, desirable_B, z0).mean())}
        if self.heldout_pairs:  # rows (chosen_0, rejected_0, ...): the implicit reward's preference
            margin_N = self.weights.beta * (logratio_B[0::2] - logratio_B[1::2])
            metrics |= {
                "dpo/heldout_accuracy": float((margin_N > 0).float().mean()),
                "dpo/heldout_margin": float(margin_N.mean()),
            }
        else:
            metrics["dpo/heldout_accuracy"] = float(((logratio_B > z0) == desirable_B).float().mean())
        return {"step": step, **metrics}


def build_kto_driver(cfg: ExperimentConfig, setup: PreferenceSetup) -> KTODriver:
    mbs = cfg.optim.micro_batch_size
    return KTODriver(
        weights=KTOWeights(cfg.dpo.beta, cfg.dpo.desirable_weight, cfg.dpo.undesirable_weight),
        rows_per_step=2 * cfg.dpo.pairs_per_step,
        policy=RowWorker(setup.policy, mbs),
        reference=RowWorker(setup.reference, mbs),
        sampler=PromptSampler(unpair(setup.train), DataCursor(seed=cfg.data.shuffle_seed)),
        make_batch=setup.rows,
        heldout=unpair(setup.heldout),
        heldout_pairs=all(isinstance(row, PreferencePair) for row in setup.heldout),
    )
