"""`hpcrl compare SWEEP` (hpcrl.launcher.compare): a real local sweep of the main job compared by the
command a user runs; the report's rows, groups and curves from known metrics; what it does with hostile
manifests, metrics files and output directories."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcrl.launcher.compare import compare, read_curve
from hpcrl.launcher.sweep_manifest import load_manifest
from tests.cli_runs import run_cli
from tests.templates import write_grpo_template
from tests.waiting import wait_until


def _template(tmp_path: Path, sweep: str) -> Path:
    return write_grpo_template(
        tmp_path, "cmp", steps=4, eval_every=2, extra=f"cluster: {{array_parallelism: 2}}\n{sweep}"
    )


def _dry_sweep(tmp_path: Path, capsys) -> Path:
    """A 2 x 2 sweep (algorithm x seed) submitted as a dry run: a manifest, run dirs not yet made."""
    template = _template(tmp_path, "sweep: {grid: {algorithm.name: [grpo, rloo], seed: [0, 1]}}\n")
    sweep = tmp_path / "sweep"
    assert run_cli(capsys, "submit", template, "--dry-run", "--sweep_dir", sweep)[0] == 0
    return sweep


def _write_metrics(run_dir: str, rows: list) -> None:
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    (Path(run_dir) / "metrics.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.heavy
@pytest.mark.dist
def test_a_finished_local_sweep_compared_by_the_command(tmp_path, capsys):
    template = _template(tmp_path, "sweep: {grid: {seed: [0, 1]}}\n")
    sweep = tmp_path / "sweep"
    assert run_cli(capsys, "submit", template, "--sweep_dir", sweep)[0] == 0

    def finished() -> bool:
        code, out, _ = run_cli(capsys, "status", sweep, "--json")
        return code == 0 and json.loads(out)["counts"] == {"COMPLETED": 2}

    wait_until(finished, 240, "both elements COMPLETED")
    stale = json.loads((sweep / "manifest.json").read_text())  # as if nobody ran `hpcrl status` since
    for entry in stale["entries"]:
        entry["state"] = "RUNNING"
    (sweep / "manifest.json").write_text(json.dumps(stale))
    code, out, _ = run_cli(capsys, "compare", sweep)
    assert code == 0 and "2/2 element(s) logged reward/heldout" in out, out
    report = (sweep / "compare" / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ") and "COMPLETED" in line]
    assert len(rows) == 2 and all("| 4 |" in row for row in rows)  # 4 steps, the final evaluation's step
    for entry, row in zip(load_manifest(sweep).entries, rows, strict=True):
        logged = [json.loads(line) for line in Path(entry.run_dir, "metrics.jsonl").read_text().splitlines()]
        final = [r["reward/heldout"] for r in logged if "reward/heldout" in r][-1]
        assert f"| {final:.4g} |" in row
    assert "| seed=" not in report  # seed is the spread, not a group: one group of 2 elements
    assert "| all | 2/2 |" in report
    assert (sweep / "compare" / "curves.png").stat().st_size > 0


def test_rows_groups_and_spread_from_known_metrics(tmp_path, capsys):
    sweep = _dry_sweep(tmp_path, capsys)
    entries = load_manifest(sweep).entries
    finals = {0: 0.5, 1: 0.7, 2: 0.2}  # grpo seeds 0/1, rloo seed 0; rloo seed 1 logged nothing yet
    for index, final in finals.items():
        _write_metrics(entries[index].run_dir, [
            {"step": 0, "reward/heldout": 0.0},
            {"step": 5, "reward/mean": 0.3},
            {"step": 10, "reward/heldout": final + 0.1},
            {"step": 20, "reward/heldout": final},
        ])  # fmt: skip
    comparison = compare(load_manifest(sweep), "reward/heldout", None)
    assert comparison.by == "algorithm.name"
    groups = comparison.groups()
    assert list(groups) == ["algorithm.name=grpo", "algorithm.name=rloo"]
    assert [c.final for c in groups["algorithm.name=grpo"]] == [0.5, 0.7]
    assert [c.best for c in groups["algorithm.name=grpo"]] == [0.6, 0.7999999999999999]
    code, out, _ = run_cli(capsys, "compare", sweep, "--out", tmp_path / "report")
    assert code == 0 and "3/4 element(s)" in out
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| algorithm.name=grpo | 2/2 | 0.6 | 0.5 | 0.7 |" in report
    assert "| algorithm.name=rloo | 1/2 | 0.2 | 0.2 | 0.2 |" in report
    assert "no metrics yet" in report
    header, rule = report.splitlines()[4:6]
    assert header.startswith("| index | algorithm.name | seed | state |") and header.count("|") == rule.count(
        "|"
    )
    # another metric, grouped by seed
    code, out, _ = run_cli(capsys, "compare", sweep, "--metric", "reward/mean", "--by", "seed")
    assert code == 0 and "3/4" in out
    assert "| seed=0 | 2/2 | 0.3 | 0.3 | 0.3 |" in (sweep / "compare" / "report.md").read_text()


def test_nothing_logged_is_exit_1_and_a_key_that_is_not_swept_is_exit_2(tmp_path, capsys):
    sweep = _dry_sweep(tmp_path, capsys)
    code, out, _ = run_cli(capsys, "compare", sweep)
    assert code == 1 and "0/4" in out
    assert (sweep / "compare" / "report.md").exists() and not (sweep / "compare" / "curves.png").exists()
    code, _, err = run_cli(capsys, "compare", sweep, "--by", "optim.lr")
    assert code == 2 and "--by" in err and "'optim.lr' is not a swept key" in err and "algorithm.name" in err


def test_hostile_metrics_lines_are_skipped_and_counted(tmp_path, capsys):
    sweep = _dry_sweep(tmp_path, capsys)
    entry = load_manifest(sweep).entries[0]
    _write_metrics(entry.run_dir, [
        {"step": 0, "reward/heldout": 0.1},
        '{"step": 1, "reward/heldout": NaN}',  # Python's json reads it: not a finite number
        '{"step": 2, "reward/heldout": true}',
        '{"step": "3", "reward/heldout": 0.9}',
        '{"step": -4, "reward/heldout": 0.9}',
        "[1, 2]",
        '{"step": 5, "reward/heldout": 1e999}',
        '{"step": 6, "reward/he',  # torn by a kill
        "\x1b[31m not json",
        '{"step": 7, "reward/heldout": 0.4}',
        "[" * 100_000,  # nesting deep enough to exhaust the parser's recursion
    ])  # fmt: skip
    curve = read_curve(entry, "reward/heldout")
    assert curve.steps == [0, 7] and curve.values == [0.1, 0.4]
    assert curve.last_step == 7 and curve.skipped == 6


def test_a_metrics_file_that_is_a_link_or_not_a_file_is_not_read(tmp_path, capsys):
    sweep = _dry_sweep(tmp_path, capsys)
    entries = load_manifest(sweep).entries
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"step": 1, "reward/heldout": 0.99}) + "\n")
    Path(entries[0].run_dir).mkdir(parents=True)
    os.symlink(secret, Path(entries[0].run_dir) / "metrics.jsonl")
    Path(entries[1].run_dir, "metrics.jsonl").mkdir(parents=True)
    Path(entries[2].run_dir).mkdir(parents=True)
    os.mkfifo(Path(entries[2].run_dir) / "metrics.jsonl")  # opened non-blocking, refused, never waited on
    code, out, _ = run_cli(capsys, "compare", sweep)
    assert code == 1 and "0/4" in out
    report = (sweep / "compare" / "report.md").read_text()
    assert "0.99" not in report and report.count("metrics unreadable") == 3


def test_hand_edited_swept_values_reach_the_report_escaped(tmp_path, capsys):
    sweep = _dry_sweep(tmp_path, capsys)
    manifest = json.loads((sweep / "manifest.json").read_text())
    manifest["entries"][0]["swept"]["algorithm.name"] = "x|y\n| forged | row |\x1b[2J$\\frac{"
    (sweep / "manifest.json").write_text(json.dumps(manifest))
    entries = load_manifest(sweep).entries
    _write_metrics(entries[0].run_dir, [{"step": 1, "reward/heldout": 0.5}])
    code, out, err = run_cli(capsys, "compare", sweep)
    assert code == 0, err
    report = (sweep / "compare" / "report.md").read_text()
    assert "\x1b" not in report and "\n| forged" not in report
    assert "x\\|y\\n\\| forged \\| row \\|\\x1b[2J$\\frac{" in report  # one cell, every pipe escaped
    assert (sweep / "compare" / "curves.png").stat().st_size > 0  # `$` did not start mathtext


def test_the_output_directory_follows_the_output_rule(tmp_path, capsys):
    sweep = _dry_sweep(tmp_path, capsys)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    for out, says in ((foreign, "not a comparison report directory"), (link, "symbolic link")):
        code, _, err = run_cli(capsys, "compare", sweep, "--out", out)
        assert code == 2 and "--out" in err and says in err, err
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "elsewhere").exists()
    assert run_cli(capsys, "compare", sweep, "--out", tmp_path / "new")[0] == 1  # a report of nothing yet
    assert run_cli(capsys, "compare", sweep, "--out", tmp_path / "new")[0] == 1  # and again: its own files


def test_the_default_metric_is_the_stages_held_out_headline(tmp_path, capsys):
    """A DPO sweep is compared by dpo/heldout_accuracy unless --metric says otherwise (issue 43)."""
    dpo = Path(__file__).resolve().parents[2] / "templates" / "dpo_tiny.yaml"
    template = tmp_path / "dpo.yaml"
    template.write_text(f"extends: {dpo}\nrun_root: {tmp_path / 'runs'}\nsweep: {{grid: {{seed: [0, 1]}}}}\n")
    sweep = tmp_path / "sweep"
    assert run_cli(capsys, "submit", template, "--dry-run", "--sweep_dir", sweep)[0] == 0
    entries = load_manifest(sweep).entries
    for entry in entries:
        _write_metrics(entry.run_dir, [{"step": 1, "dpo/heldout_accuracy": 0.75}])
    code, out, err = run_cli(capsys, "compare", sweep)
    assert code == 0 and "2/2 element(s) logged dpo/heldout_accuracy" in out, out + err
    Path(entries[0].config_path).unlink()  # unreadable: the RL headline, said in a note
    code, out, err = run_cli(capsys, "compare", sweep)
    assert code == 1 and "0/2 element(s) logged reward/heldout" in out
    assert f"hpcrl: note: {entries[0].config_path}: unreadable" in err
