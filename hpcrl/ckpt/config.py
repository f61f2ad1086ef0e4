"""Config owned by checkpointing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class CheckpointConfig:
    """When and where sharded HDF5 checkpoints are written, and how a run resumes."""

    dir: str | None = None
    """Checkpoint directory; None = <run_dir>/checkpoints."""
    every_steps: int = 10
    """Save every this many steps (0: only on signal / time limit / end)."""
    keep_last: int = 2
    """Committed checkpoints kept; older ones are deleted after a newer one verifies."""
    async_save: bool = True
    """Snapshot to host memory and write in the background; at most one save in flight."""
    resume: Literal["auto", "never"] = "auto"
    """auto: resume from `latest` when it verifies (and after a Slurm requeue)."""
    save_on_exit: bool = True
    """Save at the end of the run."""
