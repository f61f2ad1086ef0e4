"""Reward curve PNG from metrics.jsonl records (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_reward_curve(records: list[dict[str, Any]], path: Path, title: str = "reward") -> Path:
    """Train reward mean (with +-std band when logged) and held-out reward against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    steps = [r["step"] for r in records if r.get("reward/mean") is not None]
    means = [r["reward/mean"] for r in records if r.get("reward/mean") is not None]
    ax.plot(steps, means, label="train reward (mean)")
    stds = [r.get("reward/std") for r in records if r.get("reward/mean") is not None]
    if stds and all(s is not None for s in stds):
        ax.fill_between(
            steps,
            [m - s for m, s in zip(means, stds, strict=True)],
            [m + s for m, s in zip(means, stds, strict=True)],
            alpha=0.2,
        )
    held = [(r["step"], r["reward/heldout"]) for r in records if r.get("reward/heldout") is not None]
    if held:
        ax.plot(*zip(*held, strict=True), marker="o", label="held-out reward (greedy)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
