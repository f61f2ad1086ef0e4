"""The rm stage: a reward model trained on preference pairs (trainer: hpcrl.posttrain.rm)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcrl.config.ranges import Count, EveryNSteps, Steps
from hpcrl.data.validate import PreferenceReader
from hpcrl.errors import Problem
from hpcrl.experiment.kinds.kind import OfflineShape, StageKind, accuracy_headline
from hpcrl.experiment.rules import data_rules, row_batch_rules

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig


@dataclass(kw_only=True)
class RMConfig:
    """Reward model (stage: rm): a scalar head on the last token learns which of two responses is
    preferred (Bradley-Terry, hpcrl.posttrain.rm); exported as an HF `*ForSequenceClassification`."""

    steps: Steps = 100
    """Training steps (one update on `pairs_per_step` pairs each)."""
    pairs_per_step: Count = 32
    """Preference pairs (chosen, rejected) per step; each is two rows of the batch."""
    eval_every: EveryNSteps = 10
    """Evaluate held-out pairwise accuracy every this many steps (0: never)."""


def rm_rules(cfg: ExperimentConfig) -> list[Problem]:
    """The pair batch the reward model trains on (as the dpo stage's), and its data file's rows."""
    pairs = cfg.rm.pairs_per_step
    return row_batch_rules(cfg, "rm.pairs_per_step", pairs, True, "the rm stage") + data_rules(
        cfg, preference=PreferenceReader("the rm stage", "stage")
    )


KIND = StageKind(
    name="rm",
    entrypoint="hpcrl.posttrain.rm:main",
    sections=("rm",),
    rules=rm_rules,
    steps_key="rm.steps",
    model_prefix="reward.",
    headline=accuracy_headline("RM", "rm/accuracy", "rm/heldout_accuracy", "pairwise accuracy"),
    offline=OfflineShape("reward model", lambda cfg: cfg.rm.pairs_per_step, 2, scalar_head=True),
)
