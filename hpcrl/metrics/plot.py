"""A stage's headline curve (the reward of RL, the preference accuracy of DPO) as a PNG from
metrics.jsonl records (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcrl.metrics.headline import Headline


def plot_reward_curve(
    records: list[dict[str, Any]], path: Path, title: str = "reward", headline: Headline = Headline()
) -> Path:
    """The headline's train value (with its +-spread band when logged) and held-out value against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    train = [r for r in records if r.get(headline.train) is not None]
    steps = [r["step"] for r in train]
    means = [r[headline.train] for r in train]
    ax.plot(steps, means, label=f"train {headline.label} (mean)")
    stds = [r.get(headline.spread) if headline.spread else None for r in train]
    if stds and all(s is not None for s in stds):
        ax.fill_between(
            steps,
            [m - s for m, s in zip(means, stds, strict=True)],
            [m + s for m, s in zip(means, stds, strict=True)],
            alpha=0.2,
        )
    for key in (headline.heldout, *headline.heldout_also):
        held = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if held:
            ax.plot(*zip(*held, strict=True), marker="o", label=f"{headline.heldout_label} ({key})")
    ax.set_xlabel("step")
    ax.set_ylabel(headline.label)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
