"""Config owned by metrics and progress output."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

TrackerName = Literal["wandb", "mlflow"]


@dataclass(kw_only=True)
class WandbConfig:
    """Weights & Biases (the `trackers` extra): one W&B run per element, grouped by the sweep's name, its
    id hpcrl's run id (run.json), so a resumed element continues its W&B run."""

    project: str = "hpcrl"
    """The W&B project every element of the sweep logs to."""
    mode: Literal["offline", "online"] = "offline"
    """offline: under <run_dir>/wandb, uploaded later with `wandb sync <run_dir>/wandb/offline-run-*`
    (compute nodes often reach no internet); online: as it runs (needs WANDB_API_KEY or `wandb login`)."""


@dataclass(kw_only=True)
class MlflowConfig:
    """MLflow (the `trackers` extra): one experiment per sweep (its name), one MLflow run per element,
    tagged `hpcrl.run_id`, whose params are the element's user-set keys."""

    tracking_uri: str | None = None
    """Where runs go: an http(s):// tracking server, or a file store (file:/abs/path); None: the file store
    <run_root>/<name>/mlruns, beside the sweep's run directories (`mlflow ui --backend-store-uri` it)."""


@dataclass(kw_only=True)
class LoggingConfig:
    """Where per-step metrics go."""

    jsonl: bool = True
    """Write <run_dir>/metrics.jsonl, one JSON object per step."""
    tensorboard: bool = True
    """Write TensorBoard event files under <run_dir>/tb."""
    trackers: list[TrackerName] = field(default_factory=list)
    """Experiment trackers beside metrics.jsonl and TensorBoard: wandb, mlflow (`pip install
    'hpcrl[trackers]'`). Each step reaches them once: when the checkpoint that covers it is committed (a
    resume redoes the steps after `latest`, which a tracker cannot take back), or when the run ends."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Read when `trackers` lists wandb."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """Read when `trackers` lists mlflow."""
    progress: bool = True
    """Show a rich progress bar with the live headline (rank 0, when attached to a terminal or forced)."""
    plot: bool = True
    """Plot the headline curve at the end: <run_dir>/reward.png (rl), accuracy.png (dpo)."""
