"""One result schema for every benchmark: a JSONL record per measurement.

Every record carries hpcrl's figure AND its baseline's from the same run, so a report can always show
them side by side as a ratio. `write_records` appends to <results_dir>/<benchmark>.jsonl.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).parent,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass(kw_only=True)
class Record:
    """One measured quantity, with its baseline."""

    benchmark: str
    """Program that measured it (reshard, checkpoint, launcher, rollout, rl_step)."""
    metric: str
    """What was measured (bytes_per_rank, save_mb_s, ms_per_task, tokens_per_s, ...)."""
    value: float
    """hpcrl's figure (median of the repetitions)."""
    unit: str
    baseline_name: str
    """What hpcrl is compared with (naive_allgather, dd_fdatasync, hf_generate, ...)."""
    baseline_value: float
    repetitions: int = 1
    samples: list[float] = field(default_factory=list)
    """All repetitions of `value` (min/median/max derive from these)."""
    layout: str = ""
    """Parallel layout, e.g. 't=4,p=2->t_g=2,p_g=1'."""
    model_size: str = ""
    """Parameter count or model name."""
    extra: dict = field(default_factory=dict)
    commit: str = field(default_factory=git_commit)
    host: str = field(default_factory=platform.node)
    timestamp: float = field(default_factory=time.time)

    @property
    def ratio(self) -> float:
        return self.value / self.baseline_value if self.baseline_value else float("nan")

    def summary(self) -> dict:
        samples = self.samples or [self.value]
        return {"min": min(samples), "median": statistics.median(samples), "max": max(samples)}


def write_records(results_dir: str | Path, records: list[Record]) -> Path:
    """Append records to <results_dir>/<benchmark>.jsonl (one file per benchmark program)."""
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    paths = set()
    for record in records:
        path = results_dir / f"{record.benchmark}.jsonl"
        with path.open("a") as fh:
            fh.write(json.dumps({**asdict(record), **record.summary(), "ratio": record.ratio}) + "\n")
        paths.add(path)
    return results_dir
