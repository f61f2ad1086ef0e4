"""What the sweep page shows, read fresh at every refresh and never written: each element's state (from
the scheduler, as `hpcrl status` reads it, without saving the manifest), restarts, progress and last
value of the chosen metric, its curve, and its log's tail (by index, from the manifest)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpcrl.errors import ConfigError
from hpcrl.launcher import sweeps
from hpcrl.launcher.compare import Curve, compare, headline_metric
from hpcrl.launcher.element_logs import log_files, log_text, terminal_text
from hpcrl.launcher.sweep_manifest import Manifest, load_manifest
from hpcrl.metrics.sinks import METRICS_FILE, step_records

LOG_TAIL_BYTES = 16 * 1024
"""How much of an element's log the page shows (its end)."""
METRIC_SCAN_BYTES = 64 * 1024
"""How much of the end of an element's metrics.jsonl is read to list the metrics it logs."""


@dataclass(frozen=True)
class ElementRow:
    index: int
    config_id: str
    state: str
    reason: str
    restarts: int
    step: int | None
    """The last step the element logged (None: nothing yet)."""
    last: float | None
    """The last logged value of the chosen metric."""
    swept: dict[str, str]
    group: str


@dataclass(frozen=True)
class SweepView:
    name: str
    sweep_dir: str
    keys: list[str]
    metric: str
    by: str | None
    rows: list[ElementRow]
    curves: list[Curve]
    notes: list[str]

    def groups(self) -> list[str]:
        return list(dict.fromkeys(row.group for row in self.rows))


def read_view(sweep_dir: str | Path, metric: str | None, by: str | None) -> SweepView:
    """The sweep as it is now; `metric` None: the stage's headline; `by` None: the first swept key but
    seed (a `by` that is not a swept key is ignored: the page offers only swept keys)."""
    notes: list[str] = []
    manifest = sweeps.refresh(load_manifest(sweep_dir), notes, save=False)
    metric = metric or headline_metric(manifest, notes)
    comparison = compare(manifest, metric, by if by in manifest.keys else None)
    rows = [
        ElementRow(
            index=curve.entry.index,
            config_id=curve.entry.config_id,
            state=curve.entry.state,
            reason=curve.entry.reason or "",
            restarts=sweeps.restart_count(curve.entry),
            step=curve.last_step,
            last=curve.final,
            swept={k: str(curve.entry.swept.get(k, "")) for k in manifest.keys},
            group=comparison.label(curve.entry),
        )
        for curve in comparison.curves
    ]
    return SweepView(
        manifest.name,
        manifest.sweep_dir,
        list(manifest.keys),
        metric,
        comparison.by,
        rows,
        comparison.curves,
        notes,
    )


def logged_metrics(manifest: Manifest) -> list[str]:
    """The numeric metrics the elements' recent records hold (the last METRIC_SCAN_BYTES of each
    metrics.jsonl: evaluations log other keys than training steps), sorted: the page's metric choices."""
    names: set[str] = set()
    for entry in manifest.entries:
        text = log_text(Path(entry.run_dir) / METRICS_FILE, METRIC_SCAN_BYTES)
        for record in step_records(text.splitlines()):
            names |= {k for k, v in record.items() if k != "step" and type(v) in (int, float)}
    return sorted(names)


def log_tail(sweep_dir: str | Path, index: int) -> str:
    """The end of element `index`'s log as a terminal shows it, or why there is none."""
    manifest = load_manifest(sweep_dir)
    if not 0 <= index < len(manifest.entries):
        return f"(no element {index})"
    try:
        paths = log_files(manifest, index)
    except ConfigError as err:
        return f"({err.problems[0].message})"
    return "\n".join(terminal_text(log_text(path, LOG_TAIL_BYTES)) for path in paths)
