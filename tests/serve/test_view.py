"""What `hpcrl serve` reads (hpcrl.serve.view) and its command line: the rows and curves of a sweep from
its manifest and metrics, the manifest never written, log tails by index only, exit 2 for bad options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrl.launcher.sweep_manifest import load_manifest
from hpcrl.serve.page import figure, summary
from hpcrl.serve.view import log_tail, logged_metrics, read_view
from tests.cli_runs import run_cli
from tests.templates import write_grpo_template


@pytest.fixture
def dry_sweep(tmp_path, capsys) -> Path:
    """A 2 x 2 sweep (algorithm x seed) submitted as a dry run, two elements with known metrics."""
    extra = "sweep: {grid: {algorithm.name: [grpo, rloo], seed: [0, 1]}}\n"
    template = write_grpo_template(tmp_path, "view", steps=4, eval_every=2, extra=extra)
    sweep = tmp_path / "sweep"
    assert run_cli(capsys, "submit", template, "--dry-run", "--sweep_dir", sweep)[0] == 0
    for entry in load_manifest(sweep).entries[:2]:
        Path(entry.run_dir).mkdir(parents=True)
        rows = [
            {"step": s, "reward/mean": 0.1 * s, **({"reward/heldout": 0.2 * s} if s % 2 == 0 else {})}
            for s in range(4)
        ]
        rows.append("{torn")
        (Path(entry.run_dir) / "metrics.jsonl").write_text(
            "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows)
        )
    return sweep


def test_the_view_of_a_sweep_reads_rows_and_curves_and_writes_nothing(dry_sweep):
    before = (dry_sweep / "manifest.json").read_bytes()
    view = read_view(dry_sweep, None, None)
    assert (dry_sweep / "manifest.json").read_bytes() == before  # read-only: the manifest is not saved
    assert view.metric == "reward/heldout" and view.by == "algorithm.name"
    assert [r.step for r in view.rows] == [3, 3, None, None]
    assert [r.last for r in view.rows[:2]] == [pytest.approx(0.4)] * 2
    assert [r.group for r in view.rows] == ["algorithm.name=grpo"] * 2 + ["algorithm.name=rloo"] * 2
    traces = figure(view)["data"]
    assert [len(t["x"]) for t in traces] == [2, 2, 0, 0]
    assert traces[0]["line"]["color"] != traces[2]["line"]["color"]  # one colour per group
    assert summary(view) == "4 elements: 4 DRY_RUN"
    assert read_view(dry_sweep, "reward/mean", "seed").by == "seed"
    assert read_view(dry_sweep, None, "not/a/key").by == "algorithm.name"  # only a swept key colours
    assert logged_metrics(load_manifest(dry_sweep)) == ["reward/heldout", "reward/mean"]


def test_a_log_is_found_by_index_only(dry_sweep):
    assert log_tail(dry_sweep, 0) == "(element 0 was never submitted (state DRY_RUN))"
    assert log_tail(dry_sweep, 99) == "(no element 99)"
    assert log_tail(dry_sweep, -1) == "(no element -1)"


@pytest.mark.parametrize(
    ("args", "key"),
    [(["--port", "70000"], "--port"), (["--port", "-1"], "--port"), (["--refresh_s", "0"], "--refresh_s")],
)
def test_bad_options_are_exit_2_before_anything_binds(dry_sweep, capsys, args, key):
    code, _, err = run_cli(capsys, "serve", dry_sweep, *args)
    assert code == 2 and key in err, err


def test_a_directory_that_is_not_a_sweep_is_exit_2(tmp_path, capsys):
    code, _, err = run_cli(capsys, "serve", tmp_path)
    assert code == 2 and "manifest" in err, err
