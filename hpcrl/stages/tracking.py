"""The metrics logger of a stage's rank, with the experiment trackers its config lists (rank 0)."""

from __future__ import annotations

from pathlib import Path

from hpcrl.config.schema import flatten, to_dict
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.ids import user_set
from hpcrl.metrics.headline import Headline
from hpcrl.metrics.logger import MetricsLogger
from hpcrl.metrics.sinks import METRICS_FILE, step_records
from hpcrl.metrics.trackers import TRACKERS, TrackedRun, Tracker, TrackerOutbox
from hpcrl.stages.run_identity import read_identity


def metrics_logger(
    cfg: ExperimentConfig, run_dir: Path, total_steps: int, *, is_main: bool, headline: Headline = Headline()
) -> MetricsLogger:
    """The stage's logger; its trackers open when the first settled record goes out (run.json exists by
    then: the stage's checkpointing makes it at resume)."""
    run_dir = Path(run_dir)
    outbox = None
    if cfg.logging.trackers and is_main:
        outbox = TrackerOutbox(lambda: open_trackers(cfg, run_dir), lambda step: logged_before(run_dir, step))
    return MetricsLogger(
        cfg.logging, run_dir, total_steps, is_main=is_main, headline=headline, trackers=outbox
    )


def open_trackers(cfg: ExperimentConfig, run_dir: Path) -> list[Tracker]:
    data = to_dict(cfg)
    run = TrackedRun(
        run_id=read_identity(run_dir).run_id,
        name=run_dir.name,
        group=cfg.name,
        run_dir=run_dir,
        store_root=run_dir.parent,
        params={key: str(value) for key, value in flatten(user_set(data)).items()},
        config=data,
    )
    return [TRACKERS[name](cfg.logging, run) for name in dict.fromkeys(cfg.logging.trackers)]


def logged_before(run_dir: Path, step: int) -> list[dict]:
    """metrics.jsonl's records of steps before `step` (an earlier attempt's), complete lines only."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [r for r in step_records(path.read_bytes().splitlines()) if r["step"] < step]
