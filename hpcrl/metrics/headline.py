"""The figure a stage is watched by: the progress bar's live value and the curve plotted at the end."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Headline:
    """Which metrics of a stage's records are its headline (the RL stage's by default; each stage kind
    names its own, hpcrl.experiment.stage_kinds)."""

    title: str = "RL"
    """The progress bar's name of the stage."""
    train: str = "reward/mean"
    """Logged every step: the progress bar shows it, the plot draws it."""
    heldout: str = "reward/heldout"
    """Logged at evaluations: the progress bar keeps the last one, the plot marks each."""
    label: str = "reward"
    """What the train values are, for the progress bar and the plot's axis."""
    heldout_label: str = "held-out"
    """What the held-out values are called on the progress bar and in the plot's legend."""
    heldout_also: tuple[str, ...] = ("reward/heldout_task", "reward/heldout_term/model")
    """Other held-out figures, drawn and summarised beside `heldout` where a run logs them (the RL stage's
    task-rule score, logged when the training reward is not that rule alone; a reward model's score as a
    term of a mix, hpcrl.rl.collector.Collector.evaluate)."""
    spread: str | None = "reward/std"
    """A per-step standard deviation drawn as a band around `train` (None: none)."""
    plot_file: str = "reward.png"
    """The curve's file name in the run directory."""
