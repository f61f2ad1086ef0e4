"""The HF export every completed stage writes: `<run_dir>/hf`, the stage's model as a Hugging Face
directory (hpcrl.ckpt.export) that `transformers`, vLLM or the next stage of a pipeline loads.

Written once the run has completed its steps and its final checkpoint is committed, from that
checkpoint (so it is exactly what a resume would load), by rank 0, atomically: into a temporary sibling,
then renamed over any earlier `hf` (a rerun of a finished run rewrites it). A run that stopped early
(requeue, time limit) writes none; `checkpoint.export_hf: false` turns it off (a 70B model is 140 GB).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from hpcrl.ckpt.commit import read_latest, step_of
from hpcrl.ckpt.config import HF_EXPORT_DIR
from hpcrl.ckpt.export import export_hf

log = logging.getLogger(__name__)


def export_final_model(checkpoint_root: Path, run_dir: Path, prefix: str, steps: int) -> Path | None:
    """Export the `prefix` model of the committed checkpoint of step `steps` to `<run_dir>/hf`; None
    (with a warning) when `latest` is not that checkpoint (checkpoint.save_on_exit off)."""
    latest = read_latest(checkpoint_root)
    if latest is None or step_of(latest) != steps:
        log.warning("no HF export: the last committed checkpoint is not the final step %d", steps)
        return None
    out = run_dir / HF_EXPORT_DIR
    tmp = run_dir / f".{HF_EXPORT_DIR}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    export_hf(latest, tmp, prefix=prefix)
    if out.exists():
        old = run_dir / f".{HF_EXPORT_DIR}.old-{os.getpid()}"
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
    return out
