"""Config owned by checkpointing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from hpcrl.config.ranges import EveryNSteps, Positive, Range


@dataclass(kw_only=True)
class CheckpointConfig:
    """When and where sharded HDF5 checkpoints are written, and how a run resumes."""

    dir: str | None = None
    """Checkpoint directory; None = <run_dir>/checkpoints."""
    every_steps: EveryNSteps = 10
    """Save every this many steps (0: only on signal / time limit / end)."""
    keep_last: Annotated[int, Range(ge=1, le=1 << 16)] = 2
    """Committed checkpoints kept; older ones are deleted after a newer one verifies."""
    async_save: bool = True
    """Snapshot to host memory and write in the background; at most one save in flight."""
    resume: Literal["auto", "never"] = "auto"
    """auto: resume from the newest committed checkpoint that verifies: `latest`, else (see `fallback`) an
    older one (also after a Slurm requeue), provided it was written by this run (the run id in
    `<run_dir>/run.json`, see hpcrl.stages.run_identity; a checkpoint of another run is an error, exit 2,
    and one written before run ids were recorded is accepted with a warning); never: start afresh."""
    resume_from: str | None = None
    """Start a NEW run from another run's weights (fine-tuning): a checkpoint directory (`step_N`) or a
    checkpoint root (its newest verified checkpoint). Only the trainers' parameters are loaded (an fp32
    master where one is saved); the optimizer, data cursor and RNG start fresh, at step 0, under this
    run's own run id. Used only while this run has no checkpoint of its own: a restarted run resumes
    its own. A checkpoint root holding ANOTHER run's checkpoints is never resumed (`resume: auto`
    refuses it, exit 2): point `resume_from` at it and give this run its own `dir`."""
    save_on_exit: bool = True
    """Save at the end of the run."""
    export_hf: bool = True
    """Write the stage's model as a Hugging Face directory, `<run_dir>/hf`, when the run completes (from
    its final checkpoint, hpcrl.stages.export: with save_on_exit false, `expand` refuses a run whose
    every_steps does not divide its steps)."""
    fallback: bool = True
    """On resume, fall back to the previous committed checkpoint when `latest` does not verify; the
    rejected one is renamed `step_N.rejected-<UTC time>` (kept for inspection, see `keep_rejected`; it
    never blocks a commit)."""
    keep_rejected: Annotated[int, Range(ge=0, le=1 << 16)] = 1
    """Rejected checkpoints (`step_N.rejected-<UTC time>`) kept for inspection, the newest first; older
    ones are deleted before the next save (0: all of them). A rejected checkpoint is as large as a good
    one, and a run that falls back after each of many crashes would otherwise fill the disk with them."""
    deadline_safety: Annotated[float, Range(ge=0, le=100)] = 1.5
    """Save and stop when the job's time left < this x (slowest step + slowest save); 0: no deadline
    save (the time limit's signal alone stops the job)."""
    timeout_s: Positive = 600.0
    """Rank 0 waits this long for every rank's file of a save before the save fails (not committed)."""


HF_EXPORT_DIR = "hf"
"""The final HF export's name under the run dir (hpcrl.stages.export; a pipeline's `${stages.NAME.hf}`)."""


def checkpoint_root(cfg: CheckpointConfig, run_dir: str | Path) -> Path:
    """Where a run's checkpoints go: `checkpoint.dir`, else the run directory's `checkpoints/`."""
    return Path(cfg.dir) if cfg.dir else Path(run_dir) / "checkpoints"
