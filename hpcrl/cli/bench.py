"""`hpcrl bench run SUITE.yaml` and `hpcrl bench report RESULTS_DIR`.

run: executes the suite's benchmark programs (hpcrl.bench.runner); exit 0 when all succeed, 1 when one
failed or timed out (the others still ran), 2 for a bad suite template. `--results-dir DIR` writes the
records there instead of the suite's results_dir.
run --smoke: every program at its smallest size (its smoke_args) into a fresh temporary directory (or
--results-dir), each checked to exit 0 and to write valid records (hpcrl.bench.smoke); exit 1 names
each program that failed and why.
report: markdown table + PNG plots from the records (hpcrl.bench.report); exit 0, or 1 when the
directory holds no usable record. Unusable lines are listed (file:line: why) and skipped.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Literal, Optional

from hpcrl.bench.report import write_report
from hpcrl.bench.runner import load_suite, run_suite
from hpcrl.bench.smoke import run_smoke, summary_lines
from hpcrl.errors import ConfigError, Problem

HELP = "Run a benchmark suite template (run SUITE) or report a results directory (report DIR)."


def add_arguments(parser) -> None:
    parser.add_argument("action", type=Literal["run", "report"], help="run | report")
    parser.add_argument(
        "path", type=str, help="run: suite template (templates/bench/cpu.yaml); report: results dir."
    )
    parser.add_argument(
        "--out",
        type=Optional[str],
        default=None,
        help="report: output directory (default: RESULTS_DIR/report).",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="run: every program at its smallest size (smoke_args), each checked for valid records.",
    )
    parser.add_argument(
        "--results-dir",
        type=Optional[str],
        default=None,
        help="run: where records go (default: the suite's results_dir; --smoke: a fresh temporary dir).",
    )


def main(args) -> int:
    if args.action == "run" and args.smoke:
        return _smoke(args)
    if args.action == "run":
        suite = load_suite(args.path)
        if args.results_dir:
            suite = dataclasses.replace(suite, results_dir=Path(args.results_dir).resolve())
        runs = run_suite(suite)
        failed = [r.name for r in runs if not r.ok]
        print(f"[bench] {len(runs) - len(failed)}/{len(runs)} programs ok; results in {suite.results_dir}")
        if failed:
            print(f"[bench] failed: {', '.join(failed)}")
        return 1 if failed else 0
    return _report(args)


def _smoke(args) -> int:
    suite = load_suite(args.path)
    results_dir = Path(args.results_dir or tempfile.mkdtemp(prefix="hpcrl-bench-smoke-"))
    results = run_smoke(suite, results_dir)
    for line in summary_lines(results):
        print(line)
    print(f"[smoke] records, logs and runs.json in {results_dir.resolve()}")
    return 0 if all(r.ok for r in results) else 1


def _report(args) -> int:
    if not Path(args.path).is_dir():
        raise ConfigError(Problem(f"results directory {args.path} does not exist", key="path"))
    report = write_report(args.path, args.out)
    for bad in report.bad:
        print(f"[report] skipped {bad}")
    print(f"[report] {len(report.records)} record(s), {len(report.bad)} skipped -> {report.markdown}")
    for plot in report.plots:
        print(f"[report] plot {plot}")
    return 0 if report.records else 1
