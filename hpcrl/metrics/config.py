"""Config owned by metrics and progress output."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class LoggingConfig:
    """Where per-step metrics go."""

    jsonl: bool = True
    """Write <run_dir>/metrics.jsonl, one JSON object per step."""
    tensorboard: bool = True
    """Write TensorBoard event files under <run_dir>/tb."""
    progress: bool = True
    """Show a rich progress bar with the live headline (rank 0, when attached to a terminal or forced)."""
    plot: bool = True
    """Plot the headline curve at the end: <run_dir>/reward.png (rl), accuracy.png (dpo)."""
