"""`hpcrl bench run SUITE --smoke`: every program of a suite at its smallest size must exit 0 and write
valid records, or the run fails naming it. Fast tests use toy programs written into a toy repo (the
runner runs modules from the repo root); a slow test runs each real suite's smoke tier, and the
benchmark programs no suite lists (the GPU programs among them) are imported and their options built."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.bench.runner import load_suite
from hpcrl.bench.smoke import run_smoke, smoke_suite
from hpcrl.cli import main as cli_main
from hpcrl.config.yaml_io import load_yaml
from hpcrl.errors import ConfigError
from tests.bench.test_runner import OK_PROGRAM, make_repo, write_suite

REPO = Path(__file__).resolve().parents[2]
SUITES = [p for p in sorted((REPO / "templates" / "bench").glob("*.yaml")) if "programs" in load_yaml(p)]
"""The suite templates (the others there, and templates/bench/gpu/, are experiment templates)."""
SMOKED_ELSEWHERE = {"smollm2": "tests/benchmarks/test_smollm2.py, which asserts on its records"}
"""Suites whose smoke tier a test of their own runs (once per CI run, not twice)."""

# deliberately broken copies of the good program
RAISES = OK_PROGRAM.replace(
    "a = p.parse_args()", "a = p.parse_args()\nraise RuntimeError('refactor broke me')"
)
NO_RECORD = OK_PROGRAM.replace("write_records(", "print(")
MALFORMED = (  # Record() would refuse it: the line is written by hand
    "import argparse, json, pathlib\np = argparse.ArgumentParser()\np.add_argument('--results-dir')\n"
    "p.add_argument('--value')\na = p.parse_args()\npathlib.Path(a.results_dir).mkdir(exist_ok=True)\n"
    "with open(pathlib.Path(a.results_dir, 'toy.jsonl'), 'a') as fh:\n"
    "    fh.write(json.dumps({'benchmark': 'toy', 'value': 'fast', 'unit': 's'}) + '\\n')\n"
)
NEEDS_SMALL = OK_PROGRAM.replace(
    'p.add_argument("--value", type=float)',
    'p.add_argument("--value", type=float)\np.add_argument("--small", action="store_true", required=True)',
)
NEEDS_GPU = 'import argparse\nargparse.ArgumentParser().parse_args()\nraise SystemExit("no GPU here")\n'


def toy_repo(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path)
    for name, text in {
        "raises": RAISES,
        "silent": NO_RECORD,
        "malformed": MALFORMED,
        "small": NEEDS_SMALL,
        "gpu": NEEDS_GPU,
    }.items():
        (repo / "benchmarks" / f"{name}.py").write_text(text)
    return repo


@pytest.mark.heavy
def test_smoke_fails_naming_each_broken_program_and_passes_the_good_ones(tmp_path, capsys):
    repo = toy_repo(tmp_path)
    suite = write_suite(
        repo,
        """
        results_dir: out
        programs:
          - {name: good, module: benchmarks.ok, args: ["--value", 5]}
          - {name: broken, module: benchmarks.raises, args: ["--value", 5]}
          - {name: no_record, module: benchmarks.silent, args: ["--value", 5]}
          - {name: bad_record, module: benchmarks.malformed, args: ["--value", 5]}
          - {name: hangs, module: benchmarks.sleeps, timeout_s: 1}
          - {name: small, module: benchmarks.small, args: ["--value", 1e9], smoke_args: ["--value", 1, "--small"]}
        """,
    )
    assert cli_main(["bench", "run", str(suite), "--smoke", "--results-dir", str(tmp_path / "smoke")]) == 1
    out = capsys.readouterr().out
    assert "[smoke] good: ok, 1 record(s)" in out and "[smoke] small: ok, 1 record(s)" in out
    assert "[smoke] broken: FAILED: exit 1" in out
    assert "[smoke] no_record: FAILED: exited 0 but wrote no record" in out
    assert "[smoke] bad_record: FAILED: malformed record:" in out and "'value' must be a finite number" in out
    assert "[smoke] hangs: FAILED: timed out" in out
    assert "[smoke] 2/6 programs ok" in out
    assert "[smoke] failed: broken, no_record, bad_record, hangs" in out
    assert "refactor broke me" in (tmp_path / "smoke" / "logs" / "broken.log").read_text()
    runs = json.loads((tmp_path / "smoke" / "runs.json").read_text())
    assert [r["name"] for r in runs] == ["good", "broken", "no_record", "bad_record", "hangs", "small"]
    assert not (repo / "out").exists()  # the smoke tier never writes into the suite's results_dir


def test_a_good_suite_passes_and_old_records_do_not_count(tmp_path, capsys):
    repo = toy_repo(tmp_path)
    suite = write_suite(
        repo, "results_dir: out\nprograms: [{name: good, module: benchmarks.ok, args: [--value, 2]}]\n"
    )
    assert cli_main(["bench", "run", str(suite), "--smoke", "--results-dir", str(tmp_path / "s")]) == 0
    assert "[smoke] 1/1 programs ok" in capsys.readouterr().out
    # the same directory again, the program now broken: its old record must not pass it
    (repo / "benchmarks" / "ok.py").write_text(NO_RECORD)
    [result] = run_smoke(load_suite(suite), tmp_path / "s", echo=lambda _: None)
    assert not result.ok and "wrote no record" in result.problem


def test_smoke_without_results_dir_uses_a_fresh_temporary_dir(tmp_path, capsys):
    repo = toy_repo(tmp_path)
    suite = write_suite(
        repo, "results_dir: out\nprograms: [{name: good, module: benchmarks.ok, args: [--value, 2]}]\n"
    )
    assert cli_main(["bench", "run", str(suite), "--smoke"]) == 0
    where = Path(capsys.readouterr().out.split("runs.json in ")[-1].strip())
    try:
        assert where.name.startswith("hpcrl-bench-smoke-") and (where / "toy.jsonl").is_file()
        assert not (repo / "out").exists()
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.heavy
def test_results_dir_overrides_the_suites_without_smoke(tmp_path, monkeypatch):
    repo = toy_repo(tmp_path)
    suite = write_suite(
        repo, "results_dir: out\nprograms: [{name: good, module: benchmarks.ok, args: [--value, 2]}]\n"
    )
    monkeypatch.chdir(tmp_path)
    assert cli_main(["bench", "run", str(suite), "--results-dir", "elsewhere"]) == 0  # relative to the cwd
    assert (tmp_path / "elsewhere" / "toy.jsonl").is_file() and not (repo / "out").exists()


def test_a_gpu_suite_without_cuda_imports_each_program(tmp_path):
    repo = toy_repo(tmp_path)
    suite = load_suite(
        write_suite(
            repo,
            """
            results_dir: out
            needs_cuda: true
            programs:
              - {name: gpu, module: benchmarks.gpu}
              - {name: broken, module: benchmarks.raises}
            """,
        )
    )
    (repo / "benchmarks" / "raises.py").write_text("raise ImportError('megatron moved')\n")
    gpu, broken = run_smoke(suite, tmp_path / "s", echo=lambda _: None, has_cuda=lambda: False)
    assert gpu.ok and gpu.imported_only and gpu.run.command[-1] == "--help"
    assert not broken.ok and "exit 1" in broken.problem
    gpu, _ = run_smoke(suite, tmp_path / "s2", echo=lambda _: None, has_cuda=lambda: True)
    assert not gpu.ok and not gpu.imported_only  # with a GPU it is run as a CPU suite's programs are


def test_smoke_timeout_and_args_replace_the_programs(tmp_path):
    repo = toy_repo(tmp_path)
    text = "results_dir: out\nsmoke_timeout_s: 7\nprograms:\n- {name: a, module: benchmarks.ok, args: [--v, 1]}\n"
    suite = load_suite(write_suite(repo, text + "- {name: b, module: benchmarks.ok, smoke_args: [--v, 2]}\n"))
    a, b = smoke_suite(suite, tmp_path / "s").programs
    assert (a.args, a.timeout_s, b.args, b.timeout_s) == (["--v", 1], 7, ["--v", 2], 7)


def test_bad_smoke_keys_are_reported(tmp_path):
    repo = toy_repo(tmp_path)
    suite = write_suite(
        repo,
        "results_dir: out\nsmoke_timeout_s: 0\nneeds_cuda: maybe\n"
        "programs: [{name: a, module: benchmarks.ok, smoke_args: --x}]\n",
    )
    with pytest.raises(ConfigError) as info:
        load_suite(suite)
    text = "\n".join(str(p) for p in info.value.problems)
    assert all(key in text for key in ("smoke_timeout_s", "needs_cuda", "programs[0].smoke_args"))
    assert cli_main(["bench", "run", str(suite), "--smoke"]) == 2


def unlisted_modules() -> list[str]:
    """benchmarks/*.py modules that no suite lists: the GPU programs, those run by hand, helpers."""
    listed = {p.module for s in SUITES for p in load_suite(s).programs}
    every = {f"benchmarks.{p.stem}" for p in (REPO / "benchmarks").glob("*.py") if p.stem != "__init__"}
    return sorted(every - listed)


@pytest.mark.heavy
@pytest.mark.parametrize("module", unlisted_modules())
def test_programs_no_suite_lists_import_and_build_their_options(module):
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"{module}: {proc.stderr[-2000:]}"


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.beside_slurm
@pytest.mark.parametrize("suite", [s for s in SUITES if s.stem not in SMOKED_ELSEWHERE], ids=lambda p: p.stem)
def test_suite_smoke_tier(suite, tmp_path, capsys):
    """What CI pays: each suite's real smoke tier (a `needs_cuda` suite without CUDA: imports only)."""
    code = cli_main(["bench", "run", str(suite), "--smoke", "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    names = [p.name for p in load_suite(suite).programs]
    assert code == 0 and f"{len(names)}/{len(names)} programs ok" in out, out
    assert all(f"[smoke] {n}: ok" in out for n in names)
