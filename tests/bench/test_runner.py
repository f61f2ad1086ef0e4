"""`hpcrl bench run`: programs run as subprocesses from the repo root; a failing one is reported and the
suite goes on; bad suite templates list every problem."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from hpcrl.bench.runner import load_suite, run_suite
from hpcrl.cli import main as cli_main
from hpcrl.errors import ConfigError
from tests.processes import alive
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]

OK_PROGRAM = """
import argparse
from hpcrl.bench.records import Record, write_records
p = argparse.ArgumentParser()
p.add_argument("--results-dir")
p.add_argument("--value", type=float)
a = p.parse_args()
write_records(a.results_dir, [Record(benchmark="toy", metric="tok_s", value=a.value, unit="tok/s",
                                      baseline_name="generate", baseline_value=2 * a.value)])
print("toy done")
"""
FAILING_PROGRAM = 'import sys\nprint("about to fail")\nsys.exit(3)\n'
SLEEPING_PROGRAM = "import time\ntime.sleep(30)\n"


def make_repo(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'toy'\n")
    pkg = tmp_path / "benchmarks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ok.py").write_text(OK_PROGRAM)
    (pkg / "fails.py").write_text(FAILING_PROGRAM)
    (pkg / "sleeps.py").write_text(SLEEPING_PROGRAM)
    (tmp_path / "templates").mkdir()
    return tmp_path


def write_suite(repo: Path, text: str) -> Path:
    path = repo / "templates" / "suite.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.heavy
def test_suite_continues_past_failures_and_records_runs(tmp_path, capsys):
    repo = make_repo(tmp_path)
    suite = write_suite(
        repo,
        """
        results_dir: out
        programs:
          - {name: first, module: benchmarks.fails}
          - {name: slow, module: benchmarks.sleeps, timeout_s: 1}
          - {name: ok, module: benchmarks.ok, args: ["--value", 5]}
        """,
    )
    assert cli_main(["bench", "run", str(suite)]) == 1
    out = capsys.readouterr().out
    assert "first: FAILED (exit 3)" in out and "slow: TIMEOUT" in out and "ok: ok" in out
    assert "2/3 programs ok" not in out and "1/3 programs ok" in out
    runs = json.loads((repo / "out" / "runs.json").read_text())
    assert [(r["name"], r["exit_code"]) for r in runs] == [("first", 3), ("slow", None), ("ok", 0)]
    assert "about to fail" in (repo / "out" / "logs" / "first.log").read_text()
    # the records the good program wrote are reportable; runs.json is not a record file
    assert cli_main(["bench", "report", str(repo / "out")]) == 0
    assert (
        "| toy | tok_s | - | - | 5 tok/s | generate | 10 tok/s | 0.5 |"
        in (repo / "out" / "report" / "report.md").read_text()
    )


@pytest.mark.heavy
def test_a_program_past_its_timeout_is_killed_with_its_children(tmp_path):
    repo = make_repo(tmp_path)
    (repo / "benchmarks" / "forks.py").write_text(
        "import argparse, pathlib, subprocess, sys, time\np = argparse.ArgumentParser()\n"
        "p.add_argument('--results-dir')\na = p.parse_args()\npathlib.Path(a.results_dir).mkdir(exist_ok=True)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "pathlib.Path(a.results_dir, 'child.pid').write_text(str(child.pid))\ntime.sleep(60)\n"
    )
    # 10 s: time enough, on a loaded machine, for the program to start its child and write its pid
    text = "results_dir: r\nprograms: [{name: forks, module: benchmarks.forks, timeout_s: 10}]\n"
    [run] = run_suite(load_suite(write_suite(repo, text)), echo=lambda _: None)
    assert run.exit_code is None
    child = int((repo / "r" / "child.pid").read_text())
    # SIGKILL was sent to the whole group; a child the loaded machine has not scheduled since still reads
    # as running until it is: wait for it (the guard only bounds a child that was never signalled)
    wait_until(lambda: not alive(child), timeout_s=60, what="the program's child to die with its group")


def test_programs_run_from_the_repo_root(tmp_path):
    repo = make_repo(tmp_path)
    (repo / "benchmarks" / "cwd.py").write_text(
        "import argparse, os, pathlib\np = argparse.ArgumentParser()\np.add_argument('--out')\n"
        "a = p.parse_args()\npathlib.Path(a.out, 'cwd.txt').write_text(os.getcwd())\n"
    )
    suite = load_suite(
        write_suite(
            repo, "results_dir: r\nprograms: [{name: cwd, module: benchmarks.cwd, results_flag: --out}]\n"
        )
    )
    [run] = run_suite(suite, echo=lambda _: None)
    assert run.ok and (repo / "r" / "cwd.txt").read_text() == str(repo)


def test_bad_suite_lists_every_problem(tmp_path):
    repo = make_repo(tmp_path)
    suite = write_suite(
        repo,
        """
        results_dir: out
        timeout: 3
        programs:
          - {name: a, module: benchmarks.missing}
          - {name: "b c", module: benchmarks.ok, args: "--x", colour: red}
          - {name: d, module: benchmarks.ok, results_flag: out, timeout_s: -1}
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_suite(suite)
    text = "\n".join(str(p) for p in info.value.problems)
    for part in (
        "timeout",
        "programs[0].module",
        "benchmarks.missing not found",
        "programs[1].name",
        "programs[1].args",
        "programs[1].colour",
        "programs[2].results_flag",
        "programs[2].timeout_s",
    ):
        assert part in text
    assert cli_main(["bench", "run", str(suite)]) == 2


def test_cpu_suite_template_is_valid():
    suite = load_suite(REPO / "templates" / "bench" / "cpu.yaml")
    assert suite.root == REPO
    assert {"reshard", "checkpoint", "launcher", "rollout", "memory_tiny"} <= {p.name for p in suite.programs}
    assert sum(p.timeout_s for p in suite.programs) <= 30 * 60  # timeouts bound a stuck suite
