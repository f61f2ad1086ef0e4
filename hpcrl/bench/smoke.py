"""`hpcrl bench run SUITE --smoke`: every program of a suite at its smallest size, checked for a record.

The smoke tier is CI's guard against a refactor that breaks a benchmark program nobody runs: each program
of the suite runs once with its `smoke_args` (hpcrl.bench.runner.Program), and passes when it exits 0
AND adds at least one record that read_records accepts and no line it rejects. Records are counted per
program as the lines it added (files are snapshotted before each run), so a reused directory's old
records never make a broken program pass. The programs are the suite's own list: a program added to a
suite is in the smoke tier with nothing else to edit.

Each program gets a fresh TMPDIR, removed after it: some programs leave their runs in the temporary
directory (benchmarks/smollm2.py: 2.1 GB a run), which CI must not pile up. It is a short path in the
system's temporary directory, not under the results directory: sockets there must fit 108 bytes.

A suite with `needs_cuda: true` on a machine without CUDA: each program is only imported and its
options built (`python -m <module> --help`, exit 0 required, no record expected).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from hpcrl.bench.records import read_records
from hpcrl.bench.runner import ProgramRun, Suite, run_program, write_runs


@dataclass(frozen=True)
class SmokeResult:
    """One program's smoke run and its verdict."""

    name: str
    """The program's name in the suite."""
    run: ProgramRun
    """Its command, exit code, duration and log."""
    records: int
    """Valid records it added to the results directory."""
    problem: str
    """Why it failed ('' when it passed)."""
    imported_only: bool = False
    """Run as `--help` only (a CUDA suite without CUDA): no record was expected."""

    @property
    def ok(self) -> bool:
        return not self.problem


def cuda_available() -> bool:
    """Whether torch sees a GPU (imported only for suites that need one)."""
    import torch

    return torch.cuda.is_available()


def smoke_suite(suite: Suite, results_dir: Path) -> Suite:
    """The suite as its smoke tier runs it: smoke args, smoke timeout, records into `results_dir`."""
    programs = [
        replace(
            p,
            args=p.args if p.smoke_args is None else p.smoke_args,
            timeout_s=suite.smoke_timeout_s or p.timeout_s,
        )
        for p in suite.programs
    ]
    return replace(suite, results_dir=results_dir, programs=programs)


def run_smoke(
    suite: Suite, results_dir: Path, *, echo: Callable[[str], None] = print, has_cuda=cuda_available
) -> list[SmokeResult]:
    """Run the suite's smoke tier into `results_dir` (runs.json and logs/ too); one result per program."""
    smoke = smoke_suite(suite, Path(results_dir).resolve())
    import_only = suite.needs_cuda and not has_cuda()
    if import_only:
        echo("[smoke] no CUDA here: each program of this GPU suite is imported (--help), not run")
        smoke = replace(smoke, programs=[replace(p, args=["--help"]) for p in smoke.programs])
    smoke.results_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for program in smoke.programs:
        before = _line_counts(smoke.results_dir)
        scratch = tempfile.mkdtemp(prefix="hpcrl-smoke-")
        try:
            run = run_program(smoke, program, echo=echo, env={**os.environ, "TMPDIR": scratch})
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if import_only:
            problem = "" if run.ok else _exit_problem(run)
            results.append(SmokeResult(program.name, run, 0, problem, imported_only=True))
            continue
        good, bad = read_records(smoke.results_dir)
        new_good = [r for path, line, r in good if line > before.get(path, 0)]
        new_bad = [b for b in bad if b.line > before.get(b.path, 0)]
        results.append(SmokeResult(program.name, run, len(new_good), _problem(run, len(new_good), new_bad)))
    write_runs(smoke.results_dir, [r.run for r in results])
    return results


def _line_counts(results_dir: Path) -> dict[Path, int]:
    """Lines of each *.jsonl file now: a program's records are the lines after these."""
    return {p: len(p.read_text(errors="replace").splitlines()) for p in results_dir.rglob("*.jsonl")}


def _exit_problem(run: ProgramRun) -> str:
    if run.exit_code is None:
        return f"timed out after {run.duration_s:.0f} s (log: {run.log})"
    return f"exit {run.exit_code} (log: {run.log})"


def _problem(run: ProgramRun, records: int, bad: list) -> str:
    """Why a smoke run failed: its exit, a malformed record line, or no record at all."""
    if not run.ok:
        return _exit_problem(run)
    if bad:
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        return f"malformed record: {bad[0]}{more}"
    if not records:
        return f"exited 0 but wrote no record (log: {run.log})"
    return ""


def summary_lines(results: list[SmokeResult]) -> list[str]:
    """One line per program, then the count and the failed programs with why."""
    lines = []
    for r in results:
        if not r.ok:
            lines.append(f"[smoke] {r.name}: FAILED: {r.problem}")
        elif r.imported_only:
            lines.append(f"[smoke] {r.name}: ok (imported, --help) in {r.run.duration_s:.1f} s")
        else:
            lines.append(f"[smoke] {r.name}: ok, {r.records} record(s) in {r.run.duration_s:.1f} s")
    failed = [r.name for r in results if not r.ok]
    total = sum(r.run.duration_s for r in results)
    lines.append(f"[smoke] {len(results) - len(failed)}/{len(results)} programs ok in {total:.1f} s")
    if failed:
        lines.append(f"[smoke] failed: {', '.join(failed)}")
    return lines
