"""`hpcrl compare SWEEP`: a sweep's elements side by side, as a report (markdown + PNG).

- report.md: one row per element: index, its swept values, state, the last step logged, the final and the
  best value of the compared metric (default `reward/heldout`); then, grouped by one sweep axis (`--by`,
  default the first swept key that is not `seed`), each group's final value as mean and range over its
  elements (over seeds when the sweep has a `seed` axis).
- curves.png: the metric against the step, one colour per group; a group of several elements (seeds) is
  drawn as its mean with the min..max band over the steps every element logged.

Everything read is untrusted: the manifest through hpcrl.launcher.sweep_manifest.load_manifest, each element's
`<run_dir>/metrics.jsonl` as a regular file (never through a symlink, at most MAX_METRICS_BYTES), its
lines parsed one by one (a torn line, a non-number, a NaN is skipped and counted). Text from them reaches
the report escaped (control characters, and `|` in table cells). The output directory follows the rule of
every directory hpcrl writes (hpcrl.config.output_dirs): default `<sweep>/compare`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from hpcrl.config.output_dirs import DirKind, output_dir_problem
from hpcrl.config.safe_read import read_capped
from hpcrl.errors import ConfigError, Problem, printable
from hpcrl.experiment.stage_kinds import stage_of
from hpcrl.launcher.element import load_resolved
from hpcrl.launcher.sweep_manifest import Entry, Manifest
from hpcrl.metrics.headline import Headline
from hpcrl.metrics.sinks import METRICS_FILE, step_record

REPORT, CURVES = "report.md", "curves.png"
COMPARE_DIR = DirKind("a comparison report directory", frozenset({REPORT, CURVES}))
MAX_METRICS_BYTES = 256 << 20
"""metrics.jsonl of a million steps is ~1 GB only with hundreds of metrics; 256 MiB refuses a runaway."""
SEED_KEY = "seed"


@dataclass
class Curve:
    """One element's values of the compared metric."""

    entry: Entry
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    last_step: int | None = None
    """The last step any record logged (the element's progress, with or without the metric)."""
    skipped: int = 0
    """Lines that were not a record with a whole step (torn, not JSON, not an object)."""
    note: str | None = None
    """Why nothing was read, when nothing was."""

    @property
    def final(self) -> float | None:
        return self.values[-1] if self.values else None

    @property
    def best(self) -> float | None:
        return max(self.values) if self.values else None


@dataclass
class Comparison:
    manifest: Manifest
    metric: str
    by: str | None
    curves: list[Curve]

    def groups(self) -> dict[str, list[Curve]]:
        """Curves by their value of the `by` key (all in one group without one: a sweep over seeds only),
        in order."""
        out: dict[str, list[Curve]] = defaultdict(list)
        for curve in self.curves:
            out[self.label(curve.entry)].append(curve)
        return dict(out)

    def label(self, entry: Entry) -> str:
        if self.by is None:
            return "all"
        return f"{self.by}={_text(entry.swept.get(self.by))}"


DEFAULT_METRIC = Headline().heldout
"""What `hpcrl compare` compares when neither --metric nor an element's config names a stage."""


def headline_metric(manifest: Manifest, notes: list[str]) -> str:
    """The held-out headline metric of the sweep's stage (hpcrl.experiment.stage_kinds), read from its
    first element's config.yaml; DEFAULT_METRIC, with a note, when that cannot be read."""
    if not manifest.entries:
        return DEFAULT_METRIC
    path = manifest.entries[0].config_path
    try:
        return stage_of(load_resolved(path)).headline.heldout
    except (ConfigError, OSError, ValueError) as err:
        notes.append(f"{path}: unreadable ({type(err).__name__}), comparing {DEFAULT_METRIC}")
        return DEFAULT_METRIC


def compare(manifest: Manifest, metric: str, by: str | None) -> Comparison:
    """Read every element's curve of `metric`; `by` must be a swept key (ConfigError naming --by)."""
    if by is not None and by not in manifest.keys:
        swept = ", ".join(manifest.keys) or "none"
        raise ConfigError(Problem(f"{by!r} is not a swept key of this sweep (swept: {swept})", key="--by"))
    if by is None:
        by = next((k for k in manifest.keys if k != SEED_KEY), None)
    return Comparison(manifest, metric, by, [read_curve(e, metric) for e in manifest.entries])


def read_curve(entry: Entry, metric: str) -> Curve:
    curve = Curve(entry)
    path = Path(entry.run_dir) / METRICS_FILE
    try:
        raw = read_capped(path, MAX_METRICS_BYTES, follow_symlinks=False)
    except FileNotFoundError:
        curve.note = "no metrics yet"
        return curve
    except (OSError, ValueError) as err:
        curve.note = f"metrics unreadable: {getattr(err, 'strerror', None) or err}"
        return curve
    for line in raw.splitlines():
        record = step_record(line)
        if record is None:
            curve.skipped += 1
            continue
        step = record["step"]
        curve.last_step = step if curve.last_step is None else max(curve.last_step, step)
        value = record.get(metric)
        if _number(value):
            curve.steps.append(step)
            curve.values.append(float(value))
    return curve


def _number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def write_report(comparison: Comparison, out: Path) -> tuple[Path, Path | None]:
    """report.md (and curves.png when any element logged the metric) in `out`, checked first."""
    problem = output_dir_problem(out, COMPARE_DIR)
    if problem:
        raise ConfigError(Problem(f"{printable(str(out))} {problem}", key="--out"))
    out.mkdir(parents=True, exist_ok=True)
    plot = _plot(comparison, out / CURVES) if any(c.values for c in comparison.curves) else None
    report = out / REPORT
    report.write_text(_markdown(comparison, plot))
    return report, plot


def _markdown(c: Comparison, plot: Path | None) -> str:
    m = c.manifest
    keys = list(m.keys)
    lines = [
        f"# {_text(m.name)}: {_text(c.metric)}",
        "",
        f"Sweep `{_text(m.sweep_dir)}`, {len(m.entries)} element(s), grouped by "
        f"{_text(c.by) if c.by else 'nothing (one group)'}.",
        "",
        "| " + " | ".join(["index", *map(_cell, keys), "state", "last step", "final", "best", "note"]) + " |",
        "|" + "---|" * (len(keys) + 6),
    ]
    for curve in c.curves:
        e = curve.entry
        row = [
            str(e.index),
            *(_cell(e.swept.get(k, "")) for k in keys),
            _cell(e.state),
            "-" if curve.last_step is None else str(curve.last_step),
            _fmt(curve.final),
            _fmt(curve.best),
            _cell(_note(curve)),
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        f"## Final {_text(c.metric)} by group",
        "",
        "| group | elements | mean | min | max |",
        "|---|---|---|---|---|",
    ]
    for label, curves in c.groups().items():
        finals = [v for v in (curve.final for curve in curves) if v is not None]
        stats = [sum(finals) / len(finals), min(finals), max(finals)] if finals else [None] * 3
        lines.append(
            f"| {_cell(label)} | {len(finals)}/{len(curves)} | " + " | ".join(map(_fmt, stats)) + " |"
        )
    if plot is not None:
        lines += ["", f"![{_text(c.metric)}]({plot.name})"]
    return "\n".join(lines) + "\n"


def _note(curve: Curve) -> str:
    parts = [curve.note] if curve.note else []
    if curve.skipped:
        parts.append(f"{curve.skipped} unreadable line(s) skipped")
    return "; ".join(parts)


def _plot(c: Comparison, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for colour, (label, curves) in enumerate(c.groups().items()):
        drawn = [curve for curve in curves if curve.values]
        if not drawn:
            continue
        if len(drawn) == 1:
            ax.plot(drawn[0].steps, drawn[0].values, color=f"C{colour}", label=_plain(label))
            continue
        steps = sorted(set.intersection(*(set(curve.steps) for curve in drawn)))
        at = [dict(zip(curve.steps, curve.values, strict=True)) for curve in drawn]
        rows = [[values[s] for values in at] for s in steps]
        ax.plot(
            steps,
            [sum(r) / len(r) for r in rows],
            color=f"C{colour}",
            label=_plain(f"{label} (mean of {len(drawn)})"),
        )
        ax.fill_between(steps, [min(r) for r in rows], [max(r) for r in rows], color=f"C{colour}", alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel(_plain(c.metric))
    ax.set_title(_plain(f"{_text(c.manifest.name)}: {c.metric}"))
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _text(value: object) -> str:
    return printable(str(value))


def _plain(text: str) -> str:
    """Text matplotlib draws as it is: `$` would start mathtext (and a malformed one raises)."""
    return _text(text).replace("$", r"\$")


def _cell(value: object) -> str:
    """A markdown table cell: printable text, its pipes escaped."""
    return _text(value).replace("|", "\\|")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
