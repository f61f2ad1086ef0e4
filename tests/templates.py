"""Small templates over the main job (grpo_tiny) that tests write into their own directories."""

from __future__ import annotations

from pathlib import Path

GRPO = Path(__file__).resolve().parents[1] / "templates" / "grpo_tiny.yaml"


def write_grpo_template(directory: Path, name: str, *, steps: int, eval_every: int, extra: str = "") -> Path:
    """`directory/t.yaml`: grpo_tiny for `steps` steps, quiet (no TensorBoard, progress bar or plot), no
    periodic or exit checkpoint (so no HF export), runs under `directory/runs`; `extra` is appended YAML (sweep:, reward:)."""
    template = directory / "t.yaml"
    template.write_text(
        f"extends: {GRPO}\nname: {name}\nrun_root: {directory / 'runs'}\n"
        f"algorithm: {{steps: {steps}, eval_every: {eval_every}}}\n"
        "logging: {tensorboard: false, progress: false, plot: false}\n"
        "checkpoint: {every_steps: 0, save_on_exit: false, export_hf: false}\n" + extra
    )
    return template
