"""Record files -> report.md + PNGs, with partial and corrupt lines named and skipped."""

from __future__ import annotations

import json

from hpcrl.bench.records import Record, read_records, record_from_dict, write_records
from hpcrl.bench.report import write_report
from hpcrl.cli import main as cli_main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def records() -> list[Record]:
    return [
        Record(
            benchmark="checkpoint",
            metric="save_mb_s",
            value=410.0,
            unit="MB/s",
            baseline_name="dd_fdatasync",
            baseline_value=500.0,
            repetitions=3,
            samples=[400.0, 410.0, 430.0],
            commit="abc1234",
        ),
        Record(
            benchmark="reshard",
            metric="bytes_received_per_rank",
            value=3.0e6,
            unit="B",
            baseline_name="naive",
            baseline_value=7.0e6,
            layout="t=4,p=2->t_g=2,p_g=1",
            extra={"bound_bytes": 3.0e6},
            commit="abc1234",
        ),
        Record(
            benchmark="rl_step",
            metric="generate_s",
            value=0.6,
            unit="s",
            baseline_name="hf_generate",
            baseline_value=0.8,
            layout="t=1",
            extra={"phase": "generate"},
            commit="abc1234",
        ),
        Record(
            benchmark="rl_step",
            metric="train_s",
            value=0.3,
            unit="s",
            baseline_name="plain_torch",
            baseline_value=0.3,
            layout="t=1",
            extra={"phase": "train"},
            commit="abc1234",
        ),
    ]


def test_write_then_read_round_trip(tmp_path):
    write_records(tmp_path, records())
    loaded, bad = read_records(tmp_path)
    assert bad == []
    assert [r.metric for _, _, r in loaded] == [
        "save_mb_s",
        "bytes_received_per_rank",
        "generate_s",
        "train_s",
    ]
    ckpt = loaded[0][2]
    assert ckpt.summary() == {"min": 400.0, "median": 410.0, "max": 430.0} and ckpt.ratio == 410 / 500


def test_corrupt_and_partial_lines_are_named_and_the_rest_used(tmp_path, capsys):
    write_records(tmp_path, records())
    good_line = (tmp_path / "checkpoint.jsonl").read_text()
    (tmp_path / "checkpoint.jsonl").write_text(
        good_line
        + "{not json\n"
        + json.dumps(
            {
                "benchmark": "checkpoint",
                "metric": "load_s",
                "value": "fast",
                "unit": "s",
                "baseline_name": "dd",
                "baseline_value": 1.0,
            }
        )
        + "\n"
        + "[1, 2]\n"
        + good_line.replace('"metric": "save_mb_s"', '"metric": "save2"').replace("410.0,", "NaN,", 1)
        + good_line[: len(good_line) // 2]  # a writer killed mid-line
    )
    assert cli_main(["bench", "report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    report = (tmp_path / "report" / "report.md").read_text()
    for where, why in (
        ("checkpoint.jsonl:2", "not JSON"),
        ("checkpoint.jsonl:3", "'value' must be a finite number, got 'fast'"),
        ("checkpoint.jsonl:4", "a record must be a JSON object, got list"),
        ("checkpoint.jsonl:5", "'value' must be a finite number, got nan"),
        ("checkpoint.jsonl:6", "partial record"),
    ):
        [printed] = [line for line in out.splitlines() if f"/{where}:" in line]
        [listed] = [line for line in report.splitlines() if f"`{where}`" in line]
        assert why in printed and why in listed
    # every good record is a row with hpcrl's value next to its baseline
    assert (
        "| checkpoint | save_mb_s | - | - | 410 MB/s | dd_fdatasync | 500 MB/s | 0.82 | 400 / 410 / 430 | abc1234 |"
        in report
    )
    assert "| reshard | bytes_received_per_rank | t=4,p=2->t_g=2,p_g=1 |" in report
    for png in ("checkpoint.png", "reshard.png", "rl_step.png", "rl_step_breakdown.png"):
        assert (tmp_path / "report" / png).read_bytes()[:8] == PNG_MAGIC


def test_newest_duplicate_wins(tmp_path):
    old, new = records()[0], records()[0]
    old.value, old.timestamp = 1.0, 100.0
    new.value, new.timestamp = 2.0, 200.0
    write_records(tmp_path, [new, old])
    report = write_report(tmp_path, tmp_path / "out")
    assert [r.value for r in report.records] == [2.0] and report.superseded == 1
    assert "1 older duplicate record(s) superseded" in (tmp_path / "out" / "report.md").read_text()


def test_record_from_dict_lists_every_problem():
    try:
        record_from_dict({"benchmark": "", "metric": "m", "value": True, "samples": [1, "x"]})
    except ValueError as err:
        text = str(err)
    for part in (
        "missing field 'unit'",
        "missing field 'baseline_value'",
        "'benchmark' must be a non-empty string",
        "'value' must be a finite number",
        "'samples' must hold finite numbers",
    ):
        assert part in text


def test_empty_or_missing_directory(tmp_path, capsys):
    assert cli_main(["bench", "report", str(tmp_path)]) == 1
    assert cli_main(["bench", "report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_report_says_when_where_and_from_which_commit_its_figures_come():
    """A published figure carries its run: the records' UTC dates, hosts and commits head the report."""
    from hpcrl.bench.report import provenance

    first, second = records()[0], records()[1]
    first.timestamp, first.host, first.commit = 1796558400.0, "vm-a", "abc1234"  # 2026-12-06 UTC
    second.timestamp, second.host, second.commit = 1796644800.0, "vm-b", "def5678"  # a day later
    assert provenance([first]) == "Measured 2026-12-06 (UTC) on vm-a, commit abc1234."
    assert provenance([first, second]) == (
        "Measured 2026-12-06 to 2026-12-07 (UTC) on vm-a, vm-b, commit abc1234, def5678."
    )
    assert provenance([]) == "No usable record."
