"""MetricsLogger: the sinks a LoggingConfig asks for, on the main rank only; the experiment trackers
(hpcrl.metrics.trackers) behind their outbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcrl.metrics.config import LoggingConfig
from hpcrl.metrics.headline import Headline
from hpcrl.metrics.plot import plot_reward_curve
from hpcrl.metrics.sinks import METRICS_FILE, JsonlWriter, ProgressBar, TensorBoardWriter, read_jsonl
from hpcrl.metrics.trackers import TrackerOutbox


class MetricsLogger:
    """Fans each step's record out to JSONL / TensorBoard / progress bar; plots the headline on close.

    On non-main ranks every call is a no-op, so callers need no rank checks.
    """

    def __init__(
        self,
        cfg: LoggingConfig,
        run_dir: Path,
        total_steps: int,
        *,
        is_main: bool = True,
        start_step: int = 0,
        force_progress: bool = False,
        headline: Headline = Headline(),
        trackers: TrackerOutbox | None = None,
    ):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.sinks: list[Any] = []
        self.is_main = is_main
        self.headline = headline
        self.trackers = trackers if is_main else None
        """The experiment trackers' outbox: records reach them once settled (`settle`, `close_trackers`)."""
        if not is_main:
            return
        if cfg.jsonl:
            self.sinks.append(JsonlWriter(self.run_dir))
        if cfg.tensorboard:
            self.sinks.append(TensorBoardWriter(self.run_dir))
        if cfg.progress:
            self.sinks.append(ProgressBar(total_steps, start_step, force=force_progress, headline=headline))

    def log(self, record: dict[str, Any]) -> None:
        if "step" not in record:
            raise ValueError(f"metrics record without 'step': {sorted(record)}")
        for sink in self.sinks:
            sink.write(record)
        if self.trackers is not None:
            self.trackers.hold(record)

    def settle(self, completed_steps: int) -> None:
        """A checkpoint of `completed_steps` steps is committed: the trackers get the steps before it."""
        if self.trackers is not None:
            self.trackers.settle(completed_steps)

    def close_trackers(self, completed: bool) -> int:
        """The run is over (completed: every record is final); returns the records not sent (the next
        attempt redoes those steps)."""
        return 0 if self.trackers is None else self.trackers.close(completed)

    def close(self) -> Path | None:
        """Close sinks; return the headline plot's path when one was written."""
        for sink in self.sinks:
            sink.close()
        self.sinks = []
        metrics = self.run_dir / METRICS_FILE
        if self.is_main and self.cfg.plot and metrics.exists():
            records = read_jsonl(metrics)
            if records:
                path = self.run_dir / self.headline.plot_file
                return plot_reward_curve(records, path, title=self.run_dir.name, headline=self.headline)
        return None
