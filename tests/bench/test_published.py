"""Published benchmark figures come from records, never from a hand: each docs/performance/<suite>/ holds
the records of one named run (records/*.jsonl, as the suite's programs wrote them) and report.md, which
must be exactly what `hpcrl bench report` writes from them; docs/performance.md links every
such report and types no figure table of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrl.bench.report import write_report

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = sorted(p.parent for p in (REPO / "docs" / "performance").glob("*/report.md"))


def test_the_cpu_suite_is_published():
    assert REPO / "docs" / "performance" / "cpu" in PUBLISHED


@pytest.mark.heavy  # matplotlib draws every plot
@pytest.mark.parametrize("published", PUBLISHED, ids=lambda p: p.name)
def test_a_published_report_is_what_bench_report_writes_from_its_records(published, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the report names its records directory as given: relative, as published
    report = write_report(published.relative_to(REPO) / "records", tmp_path)
    assert not report.bad
    assert report.markdown.read_text() == (published / "report.md").read_text()
    assert sorted(p.name for p in report.plots) == sorted(p.name for p in published.glob("*.png"))


def test_the_performance_page_links_every_report_and_types_no_figure_table():
    section = (REPO / "docs" / "performance.md").read_text()
    for published in PUBLISHED:
        assert f"({published.relative_to(REPO / 'docs')}/report.md)" in section
    assert [line for line in section.splitlines() if line.lstrip().startswith("|")] == []
