"""The benchmark result schema: one JSON line per measurement (`Record`), and a tolerant reader.

Every record carries hpcrl's figure AND its baseline's from the same run, so a report can always show
them side by side as a ratio. `write_records` appends to <results_dir>/<benchmark>.jsonl and adds the
derived fields `min`, `median`, `max` (over `samples`) and `ratio` (value / baseline_value).

Conventions the report understands (all optional, in `extra`):
- `bound_bytes`: a formula bound the value is compared with (plotted as a third bar, e.g. reshard).
- `value_label`: what `value` is when "hpcrl" would mislead (e.g. "measured" vs a prediction).
- `phase`: the record is one phase's time of an RL step (metric in seconds); the report plots the
  phases' shares of the step as one stacked bar per layout/model.

`read_records(dir)` reads every *.jsonl file; a line that is not a complete, valid record becomes a
`BadRecord` (file:line and why) and the rest is used.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
DERIVED_FIELDS = ("min", "median", "max", "ratio")
"""Written by write_records for readers that don't recompute; ignored (recomputed) when read."""


def git_commit() -> str:
    """Short commit of the working tree the benchmark ran from ('unknown' outside git)."""
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
    """Program that measured it (reshard, checkpoint, launcher, rollout, rl_step, memory)."""
    metric: str
    """What was measured (bytes_per_rank, save_mb_s, ms_per_task, tokens_per_s, ...)."""
    value: float
    """hpcrl's figure (median of the repetitions)."""
    unit: str
    """Unit of value and baseline_value (B, s, ms, MB/s, tok/s, calls, ...)."""
    baseline_name: str
    """What hpcrl is compared with (naive_allgather, dd_fdatasync, hf_generate, ...)."""
    baseline_value: float
    """The baseline's figure from the same run."""
    repetitions: int = 1
    """Timed repetitions behind `value`."""
    samples: list[float] = field(default_factory=list)
    """All repetitions of `value` (min/median/max derive from these)."""
    layout: str = ""
    """Parallel layout, e.g. 't=4,p=2->t_g=2,p_g=1'."""
    model_size: str = ""
    """Parameter count or model name."""
    extra: dict = field(default_factory=dict)
    """Benchmark-specific numbers (see the module doc for the keys the report plots)."""
    commit: str = field(default_factory=git_commit)
    """Git commit measured."""
    host: str = field(default_factory=platform.node)
    """Machine that measured it."""
    timestamp: float = field(default_factory=time.time)
    """Unix time of the measurement."""
    schema: int = SCHEMA_VERSION
    """Version of this schema (records without it are version 1)."""

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
    for record in records:
        path = results_dir / f"{record.benchmark}.jsonl"
        with path.open("a") as fh:
            fh.write(json.dumps({**asdict(record), **record.summary(), "ratio": record.ratio}) + "\n")
    return results_dir


@dataclass(frozen=True)
class BadRecord:
    """A line the report could not use."""

    path: Path
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


_REQUIRED = {
    "benchmark": str,
    "metric": str,
    "value": float,
    "unit": str,
    "baseline_name": str,
    "baseline_value": float,
}
_OPTIONAL = {
    "repetitions": int,
    "samples": list,
    "layout": str,
    "model_size": str,
    "extra": dict,
    "commit": str,
    "host": str,
    "timestamp": float,
    "schema": int,
}


def record_from_dict(data: Any) -> Record:
    """A Record from one decoded JSON line; ValueError says what is wrong (all problems at once)."""
    if not isinstance(data, dict):
        raise ValueError(f"a record must be a JSON object, got {type(data).__name__}")
    problems = [f"missing field '{k}'" for k in _REQUIRED if k not in data]
    known = {f.name for f in fields(Record)}
    values = {}
    for key, kind in {**_REQUIRED, **_OPTIONAL}.items():
        if key not in data:
            continue
        problem = _type_problem(key, data[key], kind)
        if problem:
            problems.append(problem)
        else:
            values[key] = float(data[key]) if kind is float else data[key]
    if "samples" in values and not all(_is_finite_number(x) for x in values["samples"]):
        problems.append("'samples' must hold finite numbers")
    if problems:
        raise ValueError("; ".join(problems))
    return Record(**{k: v for k, v in values.items() if k in known})


def _is_finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _type_problem(key: str, value: Any, kind: type) -> str | None:
    if kind is float:
        return None if _is_finite_number(value) else f"'{key}' must be a finite number, got {value!r}"
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"'{key}' must be an integer, got {value!r}"
    if kind is str and not (isinstance(value, str) and (value or key not in _REQUIRED)):
        return f"'{key}' must be a non-empty string, got {value!r}"
    if not isinstance(value, kind):
        return f"'{key}' must be a {kind.__name__}, got {type(value).__name__}"
    return None


def read_records(results_dir: str | Path) -> tuple[list[tuple[Path, int, Record]], list[BadRecord]]:
    """Every record of every *.jsonl file under `results_dir` (sorted), as (file, line, record), and the
    lines that are not records. A last line without its newline that does not parse is 'partial'."""
    good: list[tuple[Path, int, Record]] = []
    bad: list[BadRecord] = []
    for path in sorted(Path(results_dir).rglob("*.jsonl")):
        text = path.read_text(errors="replace")
        lines = text.split("\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            is_last_unterminated = number == len(lines) and not text.endswith("\n")
            try:
                data = json.loads(line)
            except json.JSONDecodeError as err:
                why = (
                    "partial record (file ends mid-line)" if is_last_unterminated else f"not JSON ({err.msg})"
                )
                bad.append(BadRecord(path, number, why))
                continue
            try:
                good.append((path, number, record_from_dict(data)))
            except ValueError as err:
                bad.append(BadRecord(path, number, str(err)))
    return good, bad
