"""`hpcrl bench report RESULTS_DIR`: one markdown table + PNG plots from a directory of record files.

Reads every *.jsonl under the directory (hpcrl.bench.records), lists the lines it could not use
(file:line and why) and reports the rest. When the same measurement (benchmark, metric, layout,
model size) appears several times (results files are appended to), the newest one is reported.

Outputs, in the output directory (default: RESULTS_DIR/report, so a benchmark's own files are never
overwritten):
- report.md: where the figures come from (the records' UTC dates, machines and commits: `provenance`),
  then a row per measurement: benchmark, metric, layout, model, hpcrl value, baseline name and value,
  ratio (value / baseline), min/median/max of the repetitions, commit; then the bad lines. Published
  figures are such a report of a named run (docs/performance/), never copied by hand.
- <benchmark>.png: hpcrl vs baseline (and the formula bound where a record carries `extra.bound_bytes`)
  per measurement, one panel per unit, log scale when values span more than two decades.
- <benchmark>_breakdown.png: for records with `extra.phase`, each phase's share of the step time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from hpcrl.bench.records import BadRecord, Record, read_records

BYTE_UNITS = {"B", "bytes", "byte"}


@dataclass
class Report:
    markdown: Path
    plots: list[Path]
    records: list[Record]
    bad: list[BadRecord]
    superseded: int


def fmt(x: float) -> str:
    """4 significant digits; integers stay integers."""
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.4g}"


def latest(records: list[Record]) -> tuple[list[Record], int]:
    """The newest record per (benchmark, metric, layout, model_size), in first-seen order."""
    newest: dict[tuple, Record] = {}
    for r in records:
        key = (r.benchmark, r.metric, r.layout, r.model_size)
        if key not in newest or r.timestamp >= newest[key].timestamp:
            newest[key] = r
    return list(newest.values()), len(records) - len(newest)


def markdown_table(records: list[Record]) -> str:
    head = (
        "| benchmark | metric | layout | model | hpcrl | baseline | baseline value | ratio | min / median / max "
        "| commit |\n|---|---|---|---|---:|---|---:|---:|---:|---|\n"
    )
    rows = []
    for r in records:
        s = r.summary()
        rows.append(
            f"| {r.benchmark} | {r.metric} | {r.layout or '-'} | {r.model_size or '-'} | {fmt(r.value)} {r.unit} "
            f"| {r.baseline_name} | {fmt(r.baseline_value)} {r.unit} | {fmt(r.ratio)} "
            f"| {fmt(s['min'])} / {fmt(s['median'])} / {fmt(s['max'])} | {r.commit} |"
        )
    return head + "\n".join(rows) + "\n"


def provenance(records: list[Record]) -> str:
    """When, where and from which code the reported records were measured (UTC dates, hosts, commits)."""
    if not records:
        return "No usable record."
    days = sorted({datetime.fromtimestamp(r.timestamp, timezone.utc).strftime("%Y-%m-%d") for r in records})
    when = days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"
    hosts = ", ".join(sorted({r.host for r in records}))
    commits = ", ".join(sorted({r.commit for r in records}))
    return f"Measured {when} (UTC) on {hosts}, commit {commits}."


def bad_section(bad: list[BadRecord]) -> str:
    if not bad:
        return ""
    lines = "\n".join(f"- `{b.path.name}:{b.line}`: {b.reason}" for b in bad)
    return f"\n## Records not used ({len(bad)})\n\n{lines}\n"


def write_report(results_dir: str | Path, out_dir: str | Path | None = None) -> Report:
    """Read `results_dir`, write report.md and the plots into `out_dir` (default: results_dir/report)."""
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir else results_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    loaded, bad = read_records(results_dir)
    records, superseded = latest([r for _, _, r in loaded])
    plots: list[Path] = []
    by_benchmark: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_benchmark[r.benchmark].append(r)
    for name, group in by_benchmark.items():
        plots.append(plot_comparison(name, group, out / f"{name}.png"))
        phases = [r for r in group if "phase" in r.extra]
        if phases:
            plots.append(plot_breakdown(name, phases, out / f"{name}_breakdown.png"))
    note = f"\n{superseded} older duplicate record(s) superseded by newer ones.\n" if superseded else ""
    images = "".join(f"\n![{p.stem}]({p.name})\n" for p in plots)
    text = (
        f"# Benchmark report: {results_dir}\n\n{provenance(records)} {len(records)} measurement(s) from "
        f"{len({r.benchmark for r in records})} benchmark(s); ratio = hpcrl / baseline.\n\n"
        f"{markdown_table(records)}{note}{bad_section(bad)}{images}"
    )
    markdown = out / "report.md"
    markdown.write_text(text)
    return Report(markdown=markdown, plots=plots, records=records, bad=bad, superseded=superseded)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_comparison(benchmark: str, records: list[Record], path: Path) -> Path:
    """One panel per metric, a group of bars per layout/model: hpcrl, baseline, and the formula bound
    for byte metrics whose record carries `extra.bound_bytes`."""
    plt = _pyplot()
    by_metric: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_metric[r.metric].append(r)
    widest = max(map(len, by_metric.values()))
    fig, axes = plt.subplots(
        len(by_metric), 1, figsize=(max(6.0, 0.9 * widest + 2), 2.8 * len(by_metric)), squeeze=False
    )
    for ax, (metric, group) in zip(axes[:, 0], by_metric.items(), strict=True):
        _bars(ax, metric, group)
    axes[0, 0].set_title(f"{benchmark}: hpcrl vs baseline (same run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax, metric: str, group: list[Record]) -> None:
    xs = range(len(group))
    label = str(group[0].extra.get("value_label", "hpcrl"))
    series = [(label, [r.value for r in group]), ("baseline", [r.baseline_value for r in group])]
    if group[0].unit in BYTE_UNITS and any("bound_bytes" in r.extra for r in group):
        series.append(("formula bound", [float(r.extra.get("bound_bytes", 0)) for r in group]))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series):
        ax.bar([x + (i - (len(series) - 1) / 2) * width for x in xs], values, width, label=label)
    for x, r in zip(xs, group, strict=True):
        s = r.summary()
        if s["max"] > s["min"]:  # the spread of the repetitions, drawn around their median
            lo, hi = s["median"] - s["min"], s["max"] - s["median"]
            ax.errorbar(
                [x - (len(series) - 1) / 2 * width], [s["median"]], yerr=[[lo], [hi]], fmt="none", color="k"
            )
    ax.set_xticks(list(xs), [_label(r) for r in group], fontsize=7, rotation=20, ha="right")
    pad = max(0.0, (3 - len(group)) / 2)  # keep a lone group from stretching over the whole panel
    ax.set_xlim(-0.6 - pad, len(group) - 0.4 + pad)
    ax.set_ylabel(f"{metric} [{group[0].unit}]", fontsize=8)
    positive = [v for _, values in series for v in values if v > 0]
    if positive and max(positive) / min(positive) > 100:
        ax.set_yscale("log")
    baselines = ", ".join(sorted({r.baseline_name for r in group}))
    ax.legend(fontsize=7, title=f"baseline: {baselines}"[:90], title_fontsize=6)


def _label(r: Record) -> str:
    """x tick of a measurement: its layout and model, whichever are set."""
    return "\n".join(part for part in (r.layout, r.model_size) if part) or "-"


def plot_breakdown(benchmark: str, records: list[Record], path: Path) -> Path:
    """Stacked shares of the step time per (layout, model): each phase's seconds / their sum."""
    plt = _pyplot()
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    for r in records:
        groups[_label(r)][str(r.extra["phase"])] = r.value
    phases = sorted({p for g in groups.values() for p in g})
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.7 * len(groups)))
    names = list(groups)
    left = [0.0] * len(names)
    for phase in phases:
        shares = [groups[n].get(phase, 0.0) / (sum(groups[n].values()) or 1.0) for n in names]
        ax.barh(names, shares, left=left, label=phase)
        left = [a + b for a, b in zip(left, shares, strict=True)]
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of step time")
    ax.set_title(f"{benchmark}: time per phase")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
