"""Metric sinks: JSONL file, TensorBoard, a rich progress bar with live reward.

A record is a flat dict of JSON-serialisable scalars with a `step` key; slash-separated names group
metrics (`reward/mean`, `time/generate_s`). Each sink has `write(record)` and `close()`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from hpcrl.metrics.headline import Headline

METRICS_FILE = "metrics.jsonl"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no NaN/Infinity
    return value


class JsonlWriter:
    """Appends one JSON object per step to <run_dir>/metrics.jsonl (flushed each step, so a crash
    or preemption keeps every finished step)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: TextIO = self.path.open("a")

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps({k: _jsonable(v) for k, v in record.items()}, sort_keys=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with Path(path).open() as fh:
        return [json.loads(line) for line in fh if line.strip()]


def step_records(lines: Iterable[str | bytes]) -> Iterator[dict[str, Any]]:
    """The records of metrics.jsonl lines that read as one (`step_record`), the others skipped: the tolerant
    reader for files another process may be writing or may have died writing."""
    for line in lines:
        record = step_record(line)
        if record is not None:
            yield record


def step_record(line: str | bytes) -> dict[str, Any] | None:
    """A metrics.jsonl line as its record: a JSON object with a non-negative int `step`; None for a torn
    last line (a killed writer), a hand edit or garbage, never an exception."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if isinstance(record, dict) and type(record.get("step")) is int and record["step"] >= 0:
        return record
    return None


class TensorBoardWriter:
    """Scalars under <run_dir>/tb, one tag per metric name.

    The SummaryWriter opens at the first record, with `purge_step` = that record's step: the step this
    attempt starts at (0, or the resume step). An earlier attempt of the run may have logged steps from
    there on before it was killed; they are redone now, so TensorBoard must drop them, as
    `cut_metrics_back` does for metrics.jsonl. TensorBoard's reader drops events with step >= the
    purge step from the event files it read before this one (torch writes a SessionLog.START event at
    that step first). Opening lazily also leaves no empty event file when nothing is logged.
    """

    def __init__(self, run_dir: Path):
        self.log_dir = Path(run_dir) / "tb"
        self.writer = None

    def write(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=step)
        for name, value in record.items():
            if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class ProgressBar:
    """rich progress bar: steps done, elapsed, and the latest train / held-out headline value (the reward
    of RL; hpcrl.metrics.headline).

    On a terminal it redraws live. Otherwise (Slurm logs, CI, pipes) it prints one plain line at each
    held-out evaluation and every `plain_every` steps, so a batch log still shows the reward rising.
    """

    plain_every = 25

    def __init__(
        self, total_steps: int, start_step: int = 0, force: bool = False, headline: Headline = Headline()
    ):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True, force_terminal=True if force else None)
        self.enabled = force or console.is_terminal
        self.progress = Progress(
            TextColumn(f"[bold]{headline.title}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=console,
            disable=not self.enabled,
        )
        self.task = self.progress.add_task("rl", total=total_steps, completed=start_step, status="")
        self.heldout: float | None = None
        self.headline = headline
        self.total_steps = total_steps
        self.started_s = time.monotonic()
        self.progress.start()

    def write(self, record: dict[str, Any]) -> None:
        train, heldout = record.get(self.headline.train), record.get(self.headline.heldout)
        if heldout is not None:
            self.heldout = heldout
        parts = [] if train is None else [f"{self.headline.label} {train:.3f}"]
        if self.heldout is not None:
            parts.append(f"{self.headline.heldout_label} {self.heldout:.3f}")
        status = "  ".join(parts)
        done = min(int(record["step"]) + 1, self.total_steps)  # a final eval-only record has step == total
        self.progress.update(self.task, completed=done, status=status)
        if not self.enabled and (heldout is not None or done % self.plain_every == 1):
            elapsed_s = time.monotonic() - self.started_s
            print(f"step {done}/{self.total_steps}  {status}  {elapsed_s:.1f}s", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.progress.stop()
