"""`hpcrl bench run TEMPLATE`: run a suite of benchmark programs, each as a subprocess, and keep going.

A suite template (templates/bench/*.yaml):

    results_dir: bench-results/cpu      # relative to the repo root; every program writes its records here
    timeout_s: 300                      # default per program
    programs:
      - name: reshard                   # label (and log file name)
        module: benchmarks.reshard      # run as `python -m <module> --results-dir <dir> <args...>`
        args: ["--reps", "2"]
        results_flag: --results-dir     # optional: the program's flag for the results directory
        timeout_s: 120                  # optional

Programs run from the repository root (the directory holding the template's `benchmarks/`), one after
the other; stdout+stderr go to <results_dir>/logs/<name>.log; exit code, duration and timeout of each
are written to <results_dir>/runs.json and printed. A failing program is reported and the next runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpcrl.config.yaml_io import load_yaml
from hpcrl.errors import ConfigError, Problem

_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_SUITE_KEYS = {"results_dir", "timeout_s", "programs"}
_PROGRAM_KEYS = {"name", "module", "args", "results_flag", "timeout_s"}


@dataclass(frozen=True)
class Program:
    name: str
    module: str
    args: list[str] = field(default_factory=list)
    results_flag: str = "--results-dir"
    timeout_s: float = 300.0


@dataclass(frozen=True)
class Suite:
    path: Path
    root: Path
    """Repository root the programs run from."""
    results_dir: Path
    programs: list[Program]


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
    """Read and check a suite template; ConfigError lists every problem with file and key."""
    path = Path(path)
    data = load_yaml(path) or {}
    file = str(path)
    problems: list[Problem] = []
    if not isinstance(data, dict):
        raise ConfigError(Problem("a suite template must be a mapping", file=file))
    problems += [
        Problem(f"unknown key (valid: {sorted(_SUITE_KEYS)})", file, k) for k in data if k not in _SUITE_KEYS
    ]
    default_timeout = data.get("timeout_s", 300)
    if not isinstance(default_timeout, (int, float)) or default_timeout <= 0:
        problems.append(Problem(f"must be a positive number, got {default_timeout!r}", file, "timeout_s"))
        default_timeout = 300
    if not isinstance(data.get("results_dir"), str) or not data["results_dir"]:
        problems.append(
            Problem("required: the directory the programs write records into", file, "results_dir")
        )
    raw_programs = data.get("programs")
    if not isinstance(raw_programs, list) or not raw_programs:
        problems.append(Problem("required: a non-empty list of programs", file, "programs"))
        raw_programs = []
    root = find_root(path.parent)
    programs = []
    for i, raw in enumerate(raw_programs):
        program, found = _program(raw, f"programs[{i}]", file, float(default_timeout), root)
        problems += found
        if program:
            programs.append(program)
    names = [p.name for p in programs]
    problems += [
        Problem(f"duplicate program name {n!r}", file, "programs")
        for n in sorted({n for n in names if names.count(n) > 1})
    ]
    if problems:
        raise ConfigError(problems)
    return Suite(path=path, root=root, results_dir=root / data["results_dir"], programs=programs)


def _program(
    raw, key: str, file: str, default_timeout: float, root: Path
) -> tuple[Program | None, list[Problem]]:
    if not isinstance(raw, dict):
        return None, [Problem("must be a mapping with name and module", file, key)]
    problems = [
        Problem(f"unknown key (valid: {sorted(_PROGRAM_KEYS)})", file, f"{key}.{k}")
        for k in raw
        if k not in _PROGRAM_KEYS
    ]
    name, module = raw.get("name"), raw.get("module")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problems.append(
            Problem(f"must be a name of letters, digits, _.- , got {name!r}", file, f"{key}.name")
        )
    if not isinstance(module, str) or not _MODULE.fullmatch(module):
        problems.append(Problem(f"must be a dotted module name, got {module!r}", file, f"{key}.module"))
    elif not _module_exists(root, module):
        problems.append(
            Problem(f"module {module} not found under {root} (or installed)", file, f"{key}.module")
        )
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
        problems.append(Problem("must be a list of strings/numbers", file, f"{key}.args"))
        args = []
    timeout = raw.get("timeout_s", default_timeout)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        problems.append(Problem(f"must be a positive number, got {timeout!r}", file, f"{key}.timeout_s"))
    flag = raw.get("results_flag", "--results-dir")
    if not isinstance(flag, str) or not flag.startswith("--"):
        problems.append(
            Problem(f"must be an option like --results-dir, got {flag!r}", file, f"{key}.results_flag")
        )
    if problems:
        return None, problems
    return Program(
        name=name, module=module, args=[str(a) for a in args], results_flag=flag, timeout_s=float(timeout)
    ), []


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
    logs = suite.results_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    runs: list[ProgramRun] = []
    for program in suite.programs:
        command = [
            sys.executable,
            "-m",
            program.module,
            program.results_flag,
            str(suite.results_dir),
            *program.args,
        ]
        log = logs / f"{program.name}.log"
        echo(f"[bench] {program.name}: {' '.join(command[1:])}")
        start = time.monotonic()
        with log.open("w") as fh:
            try:
                code: int | None = subprocess.run(
                    command, cwd=suite.root, stdout=fh, stderr=subprocess.STDOUT, timeout=program.timeout_s
                ).returncode
            except subprocess.TimeoutExpired:
                code = None
        run = ProgramRun(program.name, command, code, time.monotonic() - start, str(log))
        runs.append(run)
        status = "ok" if run.ok else ("TIMEOUT" if code is None else f"FAILED (exit {code})")
        echo(f"[bench] {program.name}: {status} in {run.duration_s:.1f} s (log: {log})")
    (suite.results_dir / "runs.json").write_text(json.dumps([asdict(r) for r in runs], indent=1) + "\n")
    return runs
