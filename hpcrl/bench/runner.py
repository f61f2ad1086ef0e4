"""`hpcrl bench run TEMPLATE`: run a suite of benchmark programs, each as a subprocess, and keep going.

A suite template (templates/bench/*.yaml):

    results_dir: bench-results/cpu      # relative to the repo root; every program writes its records here
    timeout_s: 300                      # default per program
    smoke_timeout_s: 120                # optional: per program under --smoke (default: its timeout_s)
    needs_cuda: false                   # optional: true when its programs need a GPU
    programs:
      - name: reshard                   # label (and log file name)
        module: benchmarks.reshard      # run as `python -m <module> --results-dir <dir> <args...>`
        args: ["--reps", "2"]
        smoke_args: ["--reps", "1"]     # optional: its smallest run that still writes a record
        results_flag: --results-dir     # optional: the program's flag for the results directory
        timeout_s: 120                  # optional

Programs run from the repository root (the directory holding the template's `benchmarks/`), one after
the other; stdout+stderr go to <results_dir>/logs/<name>.log; exit code, duration and timeout of each
are written to <results_dir>/runs.json and printed. A failing program is reported and the next runs;
one past its timeout is killed with its children.
`--smoke` (hpcrl.bench.smoke) runs every program with its `smoke_args` and checks its records.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hpcrl.config.schema import build, check_tree
from hpcrl.config.yaml_io import load_yaml
from hpcrl.errors import ConfigError, Problem

_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True, kw_only=True)
class Program:
    """One benchmark program of a suite (an item of the template's `programs`)."""

    name: str
    """Label, and the name of its log file: letters, digits, _ . -"""
    module: str
    """Run as `python -m <module> <results_flag> <results_dir> <args...>` from the repository root."""
    args: list[str | int | float] = field(default_factory=list)
    """Extra arguments; numbers are passed as their text."""
    smoke_args: list[str | int | float] | None = None
    """The arguments of its smallest run that still writes a record (`hpcrl bench run --smoke`, CI's
    check that it still works); None: `args`."""
    results_flag: str = "--results-dir"
    """The program's option that takes the results directory."""
    timeout_s: float | None = None
    """Seconds before it is killed; None: the suite's `timeout_s` (load_suite fills it in)."""


@dataclass(frozen=True, kw_only=True)
class SuiteTemplate:
    """A suite template's top-level keys, as written."""

    results_dir: str
    """Directory, relative to the repository root, that every program writes its records into."""
    programs: list[Any]
    """The programs, run in this order; each a mapping of Program's fields."""
    timeout_s: float = 300.0
    """Default per-program timeout in seconds."""
    smoke_timeout_s: float | None = None
    """Per-program timeout of a --smoke run, in seconds (bounds a hang in CI); None: each its timeout_s."""
    needs_cuda: bool = False
    """Its programs need a GPU: where CUDA is absent, --smoke only imports each one (`--help`)."""


@dataclass(frozen=True)
class Suite:
    path: Path
    root: Path
    """Repository root the programs run from."""
    results_dir: Path
    programs: list[Program]
    smoke_timeout_s: float | None = None
    needs_cuda: bool = False


@dataclass
class ProgramRun:
    name: str
    command: list[str]
    exit_code: int | None
    """None when it was killed at its timeout."""
    duration_s: float
    log: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def find_root(start: Path) -> Path:
    """The nearest directory at or above `start` with a pyproject.toml (the repository root)."""
    for directory in (start.resolve(), *start.resolve().parents):
        if (directory / "pyproject.toml").is_file():
            return directory
    raise ConfigError(
        Problem("no pyproject.toml above the suite template: cannot find the repo root", file=str(start))
    )


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite template; ConfigError lists every problem with file and key.

    Keys and types are checked against SuiteTemplate and Program by hpcrl.config.schema (as templates
    are against ExperimentConfig); what the types cannot say is checked here."""
    path = Path(path)
    file = str(path)
    data = load_yaml(path) or {}
    checked, problems = check_tree(data, SuiteTemplate, lambda _key: file)
    if not isinstance(data, dict):
        raise ConfigError(problems)
    root = find_root(path.parent)
    programs: list[Program] = []
    for i, raw in enumerate(checked.get("programs") or []):
        values, found = check_tree(raw, Program, lambda _key: file, prefix=f"programs[{i}].")
        found += _program_problems(values, f"programs[{i}]", file, root)
        problems += found
        if not found:
            programs.append(build(Program, values))
    problems += _suite_problems(checked, programs, file)
    if problems:
        raise ConfigError(problems)
    suite = build(SuiteTemplate, checked)
    programs = [p if p.timeout_s is not None else replace(p, timeout_s=suite.timeout_s) for p in programs]
    return Suite(
        path=path,
        root=root,
        results_dir=root / suite.results_dir,
        programs=programs,
        smoke_timeout_s=suite.smoke_timeout_s,
        needs_cuda=suite.needs_cuda,
    )


def _suite_problems(checked: dict[str, Any], programs: list[Program], file: str) -> list[Problem]:
    """The suite's rules beyond its types: a positive timeout, a results dir, programs, unique names."""
    problems = [
        Problem(f"must be a positive number, got {checked[key]!r}", file, key)
        for key in ("timeout_s", "smoke_timeout_s")
        if checked.get(key) is not None and not checked[key] > 0  # NaN too
    ]
    if checked.get("results_dir") == "":
        problems.append(
            Problem("required: the directory the programs write records into", file, "results_dir")
        )
    if checked.get("programs") == []:
        problems.append(Problem("required: a non-empty list of programs", file, "programs"))
    names = [p.name for p in programs]
    problems += [
        Problem(f"duplicate program name {n!r}", file, "programs")
        for n in sorted({n for n in names if names.count(n) > 1})
    ]
    return problems


def _program_problems(values: dict[str, Any], key: str, file: str, root: Path) -> list[Problem]:
    """A program's rules beyond its types: name and module syntax, the module exists, the flag, timeout."""
    problems = []
    name, module = values.get("name"), values.get("module")
    if name is not None and not _NAME.fullmatch(name):
        problems.append(
            Problem(f"must be a name of letters, digits, _.- , got {name!r}", file, f"{key}.name")
        )
    if module is not None and not _MODULE.fullmatch(module):
        problems.append(Problem(f"must be a dotted module name, got {module!r}", file, f"{key}.module"))
    elif module is not None and not _module_exists(root, module):
        problems.append(
            Problem(f"module {module} not found under {root} (or installed)", file, f"{key}.module")
        )
    timeout = values.get("timeout_s")
    if timeout is not None and not timeout > 0:  # NaN too
        problems.append(Problem(f"must be a positive number, got {timeout!r}", file, f"{key}.timeout_s"))
    flag = values.get("results_flag")
    if flag is not None and not flag.startswith("--"):
        problems.append(
            Problem(f"must be an option like --results-dir, got {flag!r}", file, f"{key}.results_flag")
        )
    return problems


def _module_exists(root: Path, module: str) -> bool:
    import importlib.util

    parts = module.split(".")
    local = root.joinpath(*parts)
    if local.with_suffix(".py").is_file() or (local / "__main__.py").is_file():
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run_suite(suite: Suite, *, echo=print) -> list[ProgramRun]:
    """Run every program in order; return their runs (also written to <results_dir>/runs.json)."""
    runs = [run_program(suite, program, echo=echo) for program in suite.programs]
    write_runs(suite.results_dir, runs)
    return runs


def run_program(
    suite: Suite, program: Program, *, echo=print, env: dict[str, str] | None = None
) -> ProgramRun:
    """Run one program from the repo root, its output into <results_dir>/logs/<name>.log; `env`: its
    environment (default: this process's)."""
    logs = suite.results_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        program.module,
        program.results_flag,
        str(suite.results_dir),
        *map(str, program.args),
    ]
    log = logs / f"{program.name}.log"
    echo(f"[bench] {program.name}: {' '.join(command[1:])}")
    start = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.Popen(
            command, cwd=suite.root, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        code = _wait(proc, program.timeout_s)
    run = ProgramRun(program.name, command, code, time.monotonic() - start, str(log))
    status = "ok" if run.ok else ("TIMEOUT" if code is None else f"FAILED (exit {code})")
    echo(f"[bench] {program.name}: {status} in {run.duration_s:.1f} s (log: {log})")
    return run


def _wait(proc: subprocess.Popen, timeout_s: float | None) -> int | None:
    """Its exit code, or None when it ran past `timeout_s`. Then, or when this process is interrupted,
    its whole process group is killed: a program's own children (`hpcrl run`, spawned ranks) would
    outlive it. Killed before it is reaped, so the group id cannot have been reused."""
    try:
        return proc.wait(timeout=timeout_s)
    except BaseException as err:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if isinstance(err, subprocess.TimeoutExpired):
            return None
        raise


def write_runs(results_dir: Path, runs: list[ProgramRun]) -> None:
    """<results_dir>/runs.json: each program's command, exit code, duration and log."""
    (results_dir / "runs.json").write_text(json.dumps([asdict(r) for r in runs], indent=1) + "\n")
