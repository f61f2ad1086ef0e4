"""The dpo stage: offline preference optimisation by DPO, IPO or KTO (trainers: hpcrl.posttrain.dpo,
hpcrl.posttrain.kto)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hpcrl.config.ranges import Count, EveryNSteps, Positive, Steps
from hpcrl.data.validate import PreferenceReader
from hpcrl.errors import Problem
from hpcrl.experiment.kinds.kind import OfflineShape, StageKind, accuracy_headline
from hpcrl.experiment.rules import data_rules, row_batch_rules

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig


@dataclass(kw_only=True)
class DPOConfig:
    """Offline preference optimisation (stage: dpo): a policy learns from preferences against a frozen
    reference, by DPO, IPO or KTO (`loss_type`; hpcrl.posttrain.preference_losses)."""

    steps: Steps = 40
    """Training steps (one policy update each)."""
    pairs_per_step: Count = 16
    """Preference pairs per step; each is two rows (chosen, rejected) of the batch. kto trains on
    2 x pairs_per_step unpaired rows per step (a pair's two responses count as two rows)."""
    beta: Positive = 0.1
    """Temperature beta: the weight of the implicit reward (DPO eq. 7; IPO's tau; KTO's beta)."""
    loss_type: Literal["sigmoid", "ipo", "kto"] = "sigmoid"
    """sigmoid: DPO (Rafailov et al. 2023); ipo: IPO (Azar et al. 2023, per-token log-ratios as TRL);
    kto: KTO (Ethayarajh et al. 2024) on unpaired rows (`completion`, `label`) or pairs read as two."""
    desirable_weight: Positive = 1.0
    """kto: lambda_D, the weight of desirable rows' losses."""
    undesirable_weight: Positive = 1.0
    """kto: lambda_U, the weight of undesirable rows' losses (the paper: keep lambda_D n_D / (lambda_U n_U)
    in [1, 4/3])."""
    eval_every: EveryNSteps = 5
    """Evaluate held-out preference accuracy every this many steps (0: never)."""


def dpo_rules(cfg: ExperimentConfig) -> list[Problem]:
    """What the preference stage asks of the batch (and KTO's weights of no other loss): rows reach DP ranks and
    micro-batches by count (sigmoid and ipo keep each (chosen, rejected) pair together: an even
    micro-batch), and every DP rank gets a row."""
    dpo = cfg.dpo
    paired = dpo.loss_type != "kto"
    rows = dpo.pairs_per_step if paired else 2 * dpo.pairs_per_step
    why = f"dpo.loss_type {dpo.loss_type}"
    unread = [
        Problem(f"only loss_type kto reads it ({why} would ignore it)", key=f"dpo.{key}")
        for key in ("desirable_weight", "undesirable_weight")
        if paired and getattr(dpo, key) != getattr(DPOConfig, key)
    ]
    return (
        unread
        + row_batch_rules(cfg, "dpo.pairs_per_step", rows, paired, why)
        + data_rules(cfg, preference=PreferenceReader(why, "dpo.loss_type", unpaired=not paired))
    )


KIND = StageKind(
    name="dpo",
    entrypoint="hpcrl.posttrain.dpo:main",
    sections=("dpo",),
    rules=dpo_rules,
    steps_key="dpo.steps",
    headline=accuracy_headline("DPO", "dpo/accuracy", "dpo/heldout_accuracy", "preference accuracy"),
    offline=OfflineShape("policy", lambda cfg: cfg.dpo.pairs_per_step, 2, reference=True),
)
