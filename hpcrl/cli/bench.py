"""`hpcrl bench run SUITE.yaml` and `hpcrl bench report RESULTS_DIR`.

run: executes the suite's benchmark programs (hpcrl.bench.runner); exit 0 when all succeed, 1 when one
failed or timed out (the others still ran), 2 for a bad suite template.
report: markdown table + PNG plots from the records (hpcrl.bench.report); exit 0, or 1 when the
directory holds no usable record. Unusable lines are listed (file:line: why) and skipped.
"""

from __future__ import annotations

from typing import Literal, Optional

from hpcrl.bench.report import write_report
from hpcrl.bench.runner import load_suite, run_suite
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


def main(args) -> int:
    if args.action == "run":
        suite = load_suite(args.path)
        runs = run_suite(suite)
        failed = [r.name for r in runs if not r.ok]
        print(f"[bench] {len(runs) - len(failed)}/{len(runs)} programs ok; results in {suite.results_dir}")
        if failed:
            print(f"[bench] failed: {', '.join(failed)}")
        return 1 if failed else 0
    return _report(args)


def _report(args) -> int:
    from pathlib import Path

    if not Path(args.path).is_dir():
        raise ConfigError(Problem(f"results directory {args.path} does not exist", key="path"))
    report = write_report(args.path, args.out)
    for bad in report.bad:
        print(f"[report] skipped {bad}")
    print(f"[report] {len(report.records)} record(s), {len(report.bad)} skipped -> {report.markdown}")
    for plot in report.plots:
        print(f"[report] plot {plot}")
    return 0 if report.records else 1
