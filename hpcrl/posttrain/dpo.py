"""Offline DPO and IPO: a policy trainer learns from preference pairs against a frozen reference model.

`main(cfg, run_dir)` is the entrypoint of the `dpo` stage (`stage: dpo`, see templates/dpo_tiny.yaml; it
reads the `dpo:` section, hpcrl.experiment.kinds.dpo.DPOConfig); it runs on every rank after
torch.distributed is initialised, like hpcrl.rl.job.main. `dpo.loss_type: kto` runs KTO's driver
(hpcrl.posttrain.kto) instead, on the same data. Per step of DPO / IPO:
  1. sample `dpo.pairs_per_step` pairs (resumable cursor, hpcrl.data.cursor);
  2. one [2N, S] batch, rows (chosen_0, rejected_0, chosen_1, ...): prompt + response + <eos>, the loss
     counting response tokens only;
  3. summed response log-probs of the frozen reference (the initial policy, never updated);
  4. one policy update on the pair loss (hpcrl.posttrain.preference_losses): sigmoid, DPO (Rafailov et al.
     2023, eq. 7): L = -log sigmoid(beta [(log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))]);
     ipo, IPO (Azar et al. 2023, eq. 17) on per-token log-ratios.
Metrics: dpo/loss, dpo/accuracy (share of pairs whose implicit reward prefers the chosen response),
dpo/margin (mean implicit reward margin), dpo/chosen_reward, dpo/rejected_reward; every `dpo.eval_every`
steps dpo/heldout_{loss,accuracy,margin} on the held-out pairs. The progress bar and accuracy.png show the
train and held-out accuracy (the stage's headline, hpcrl.experiment.stage_kinds).

Shape legend: B = sequences (2 per pair), N = pairs, S = prompt + response tokens (right padded).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from hpcrl.data.cursor import DataCursor, PromptSampler
from hpcrl.data.preference import PreferencePair
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.lifecycle import Lifecycle
from hpcrl.posttrain.kto import build_kto_driver
from hpcrl.posttrain.preference_losses import DPOStats, dpo_loss, ipo_loss
from hpcrl.posttrain.preference_setup import PairWorker, preference_setup
from hpcrl.stages.trainer_stage import run_trainer_stage, train_timing
from hpcrl.train.batch import TrainBatch

log = logging.getLogger(__name__)


def pair_loss(loss_type: str, logp_B, ref_B, tokens_B, beta: float) -> tuple[torch.Tensor, DPOStats]:
    """The mean pair loss of rows (chosen_0, rejected_0, ...) of summed policy and reference log-probs."""
    if loss_type == "ipo":
        ratio_B = logp_B - ref_B
        return ipo_loss(ratio_B[0::2], ratio_B[1::2], tokens_B[0::2], tokens_B[1::2], beta)
    return dpo_loss(logp_B[0::2], logp_B[1::2], ref_B[0::2], ref_B[1::2], beta)


def dpo_loss_fn(beta: float, loss_type: str = "sigmoid"):
    """The trainer's loss callback: this micro-batch's share of the mean pair loss over all pairs."""

    def loss_fn(out, mb: TrainBatch) -> tuple[torch.Tensor, dict]:
        logp_B = (out.logprobs_BT * mb.response_mask_BT).sum(dim=1)
        ref_B = mb.extras["ref_logprobs"]
        loss, stats = pair_loss(loss_type, logp_B, ref_B, mb.response_mask_BT.sum(dim=1), beta)
        with torch.no_grad():
            chosen = beta * (logp_B[0::2] - ref_B[0::2]).mean()
            rejected = beta * (logp_B[1::2] - ref_B[1::2]).mean()
        share = (len(mb) // 2) / (mb.num_global_seqs // 2)
        metrics = {
            "dpo/accuracy": stats.reward_accuracy,
            "dpo/margin": stats.reward_margin,
            "dpo/chosen_reward": chosen,
            "dpo/rejected_reward": rejected,
        }
        return loss * share, metrics

    return loss_fn


def pair_metrics(
    policy_B: torch.Tensor,
    ref_B: torch.Tensor,
    beta: float,
    prefix: str = "dpo/heldout_",
    loss_type: str = "sigmoid",
    tokens_B: torch.Tensor | None = None,
) -> dict[str, float]:
    tokens_B = torch.ones_like(policy_B) if tokens_B is None else tokens_B
    loss, stats = pair_loss(loss_type, policy_B, ref_B, tokens_B, beta)
    return {
        f"{prefix}loss": float(loss),
        f"{prefix}accuracy": stats.reward_accuracy,
        f"{prefix}margin": stats.reward_margin,
    }


@dataclass
class DPODriver:
    beta: float
    loss_type: str
    """sigmoid (DPO) or ipo (dpo.loss_type; kto has its own driver, hpcrl.posttrain.kto)."""
    pairs_per_step: int
    policy: PairWorker
    reference: PairWorker
    sampler: PromptSampler[PreferencePair]
    """Training pairs in resumable shuffled order."""
    make_batch: Callable[[list[PreferencePair]], TrainBatch]
    heldout: TrainBatch
    heldout_ref_B: torch.Tensor | None = None

    @property
    def trained(self) -> PairWorker:
        """The model the stage trains, checkpoints and exports: the policy (hpcrl.stages.trainer_stage)."""
        return self.policy

    def step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        batch = self.make_batch(self.sampler.next_batch(self.pairs_per_step))
        batch.extras["ref_logprobs"] = self.reference.sequence_logprobs(batch)
        stats = self.policy.update(batch, dpo_loss_fn(self.beta, self.loss_type))
        return {"step": step, "dpo/loss": stats.pop("loss"), **stats, **train_timing(start, batch)}

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out preference accuracy / margin of the current policy (the reference is computed once)."""
        if self.heldout_ref_B is None:
            self.heldout_ref_B = self.reference.sequence_logprobs(self.heldout)
        policy_B, tokens_B = (
            self.policy.sequence_logprobs(self.heldout),
            self.heldout.response_mask_BT.sum(dim=1),
        )
        metrics = pair_metrics(
            policy_B, self.heldout_ref_B, self.beta, loss_type=self.loss_type, tokens_B=tokens_B
        )
        return {"step": step, **metrics}


def build_dpo_driver(cfg: ExperimentConfig) -> DPODriver:
    setup = preference_setup(cfg)
    unpaired = [i for i, row in enumerate(setup.train + setup.heldout) if not isinstance(row, PreferencePair)]
    if unpaired:
        message = f"row {unpaired[0]} is unpaired (completion, label): dpo.loss_type {cfg.dpo.loss_type} needs pairs; kto reads both"
        raise ConfigError(Problem(message, cfg.data.path, "dpo.loss_type"))

    def make_batch(pairs: list[PreferencePair]) -> TrainBatch:
        prompts = [p.prompt for p in pairs for _ in range(2)]
        return setup.rows(prompts, [r for p in pairs for r in (p.chosen, p.rejected)])

    mbs = cfg.optim.micro_batch_size
    return DPODriver(
        beta=cfg.dpo.beta,
        loss_type=cfg.dpo.loss_type,
        pairs_per_step=cfg.dpo.pairs_per_step,
        policy=PairWorker(setup.policy, mbs),
        reference=PairWorker(setup.reference, mbs),
        sampler=PromptSampler(setup.train, DataCursor(seed=cfg.data.shuffle_seed)),
        make_batch=make_batch,
        heldout=make_batch(setup.heldout),
    )


def build_preference_driver(cfg: ExperimentConfig):
    """The driver of `dpo.loss_type`: DPO / IPO on pairs, or KTO on unpaired rows."""
    if cfg.dpo.loss_type == "kto":
        return build_kto_driver(cfg, preference_setup(cfg))
    return build_dpo_driver(cfg)


def main(cfg: ExperimentConfig, run_dir: Path, lifecycle: Lifecycle | None = None) -> dict:
    """Run offline DPO, IPO or KTO on this rank (hpcrl.stages.trainer_stage: checkpoints the policy as
    "actor." with its AdamW state, the row cursor and RNG states; resume=auto continues from `latest` with
    every step logged once)."""
    return run_trainer_stage(cfg, run_dir, lifecycle, build_preference_driver, cfg.dpo.eval_every)
