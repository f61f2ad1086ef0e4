"""Config owned by the reward side."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class RewardConfig:
    """Which reward scores a response."""

    name: str = "task"
    """Registry key: task (the built-in task's own rule), exact_match, gsm8k (number after ####), format, model."""
    model_path: str | None = None
    """HF sequence-classification model directory, for name=model."""
    nan_policy: str = "error"
    """What a NaN / raising reward does: error (stop) or skip (drop the sample, counted and logged)."""
