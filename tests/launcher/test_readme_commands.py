"""The README's example commands run as written: every cheap `hpcrl` / `launch/hpcrl-sbatch` line of its
code blocks and inline code (--help, --help-config, expand, plan, submit --dry-run) exits 0, and the
override example of the main job (`hpcrl run ... --parallel.tensor 2`) runs, two steps long.

Synopsis lines (with placeholders such as TEMPLATE) and commands that train, submit or need a cluster
are not run here; the list of what ran is checked to be non-trivial, so a README edit cannot silently
leave this test with nothing to do.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl import cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b")  # TEMPLATE, SWEEP_DIR, CKPT: a synopsis, not a command
RUN_EXAMPLE = "hpcrl run templates/grpo_tiny.yaml --algorithm.name rloo --parallel.tensor 2"


def readme_commands() -> list[str]:
    """Every line of a fenced code block, and every inline code span, that starts an hpcrl command."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", README, flags=re.MULTILINE | re.DOTALL)
    lines = [line.strip().removeprefix("$ ") for block in blocks for line in block.splitlines()]
    lines += re.findall(r"`([^`\n]+)`", README)
    starts = ("hpcrl ", "launch/hpcrl-sbatch ")
    return list(dict.fromkeys(line for line in lines if line.startswith(starts)))


def is_cheap(argv: list[str]) -> bool:
    """Runs in a second or two and leaves nothing behind but what it is told to write."""
    if "--help" in argv or "--help-config" in argv:
        return True
    if argv[0] == "launch/hpcrl-sbatch" or not any(arg.endswith(".yaml") for arg in argv):
        return False  # submits to Slurm; a fragment of prose (`hpcrl submit --dry-run`) names no template
    return argv[1] in ("expand", "plan") or (argv[1] == "submit" and "--dry-run" in argv)


def cheap_commands() -> list[list[str]]:
    out = []
    for line in readme_commands():
        if PLACEHOLDER.search(line) or "&&" in line or "|" in line:
            continue
        argv = shlex.split(line, comments=True)
        if is_cheap(argv):
            out.append(argv)
    return out


def test_the_readme_shows_enough_cheap_commands_to_check():
    shown = {" ".join(argv[:2]) for argv in cheap_commands()}
    assert {"hpcrl --help", "hpcrl submit", "hpcrl expand", "hpcrl plan"} <= shown, shown
    assert RUN_EXAMPLE in README


@pytest.mark.parametrize("argv", cheap_commands(), ids=" ".join)
def test_a_cheap_readme_command_exits_0(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # the README's paths are relative to the repository
    argv = [arg.replace("/tmp/demo", str(tmp_path)) for arg in argv]  # its scratch dir: this test's
    try:
        code = cli.main(argv[1:])
    except SystemExit as end:  # --help ends like argparse's
        code = end.code
    assert code == 0, capsys.readouterr().err


def test_the_override_example_of_the_main_job_runs(tmp_path):
    """Two ranks from the layout alone (locally tasks_per_node follows it); 2 steps keep it short."""
    argv = [*shlex.split(RUN_EXAMPLE)[1:], "--algorithm.steps", "2", "--run_root", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "hpcrl", *argv], cwd=REPO, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("run dir: ")
    assert "step 2/2" in done.stdout + done.stderr
