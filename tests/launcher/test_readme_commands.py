"""The documentation's example commands run as written (the README and every page of docs/): every cheap
`hpcrl` / `launch/hpcrl-sbatch` line of their code blocks and inline code (--help, --help-config, expand,
plan, submit --dry-run) exits 0, and the README's override example of the main job (`hpcrl run ...
--parallel.tensor 2`) runs, two steps long.

Synopsis lines (with placeholders such as TEMPLATE) and commands that train, submit or need a cluster
are not run here; the list of what ran is checked to be non-trivial, so a README edit cannot silently
leave this test with nothing to do.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl import cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
DOC_PAGES = sorted((REPO / "docs").glob("*.md"))
DOCS = "\n".join([README, *(page.read_text() for page in DOC_PAGES)])
"""The README and the docs/ pages it links, read as one text."""
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b")  # TEMPLATE, SWEEP_DIR, CKPT: a synopsis, not a command
RUN_EXAMPLE = "hpcrl run templates/grpo_tiny.yaml --algorithm.name rloo --parallel.tensor 2"


def readme_commands() -> list[str]:
    """Every line of a fenced code block, and every inline code span, that starts an hpcrl command."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", DOCS, flags=re.MULTILINE | re.DOTALL)
    lines = [line.strip().removeprefix("$ ") for block in blocks for line in block.splitlines()]
    lines += re.findall(r"`([^`\n]+)`", DOCS)
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


def shown_tables() -> list[tuple[str, list[str], list[list[str]]]]:
    """Every table the README shows as a command's output, as (the template of the last command before
    it in its code block, the header cells, the row cells): rows are the lines starting with '│' after a
    '┃' header (a trailing '...' cell says columns were left out)."""
    out = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", DOCS, flags=re.MULTILINE | re.DOTALL):
        template, header, rows = None, None, []
        for line in block.splitlines():
            if line.startswith("$ "):
                if header and rows:
                    out.append((template, header, rows))
                header, rows = None, []
                template = next(
                    (arg for arg in shlex.split(line[2:], comments=True) if arg.endswith(".yaml")), template
                )
            elif line.startswith("┃"):
                header = [cell.strip() for cell in line.strip("┃ ").split("┃")]
            elif line.startswith("│") and header:
                rows.append([cell.strip() for cell in line.strip("│ ").split("│")])
        if header and rows:
            out.append((template, header, rows))
    return out


def test_the_readme_shows_tables_to_check():
    assert any(template and "id" in header for template, header, _ in shown_tables())


@pytest.mark.parametrize("shown", shown_tables(), ids=lambda shown: f"{shown[0]}:{' '.join(shown[1][:4])}")
def test_ids_and_values_the_readme_shows_are_the_real_ones(shown, capsys, monkeypatch):
    """`hpcrl expand templates/sweeps/probe-24.yaml` printed other ids than the README's (they drifted with
    the config); each shown row's id and swept values must be what expand prints today."""
    template, header, rows = shown
    monkeypatch.chdir(REPO)
    capsys.readouterr()
    assert cli.main(["expand", template, "--json"]) == 0
    real = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for row in rows:
        cells = dict(zip(header, row, strict=False))
        element = real[int(cells["index"])]
        assert cells["id"] == element["config_id"], (template, row)
        for key, value in cells.items():
            if key in element["swept"] and value != "...":
                assert value == str(element["swept"][key]), (template, key, row)


SHOWN_RUN_DIRS = re.findall(r"runs/(\w+)/([0-9a-f]{10})\b", DOCS)


def test_the_run_dirs_the_readme_shows_are_the_templates_config_ids(capsys, monkeypatch):
    """`runs/grpo_tiny/<id>` in the main job's shown output is templates/grpo_tiny.yaml's config id (a new
    config field changes every id)."""
    assert SHOWN_RUN_DIRS
    monkeypatch.chdir(REPO)
    for name, shown_id in SHOWN_RUN_DIRS:
        capsys.readouterr()
        assert cli.main(["expand", f"templates/{name}.yaml", "--json"]) == 0
        assert json.loads(capsys.readouterr().out.splitlines()[0])["config_id"] == shown_id, name


@pytest.mark.heavy
def test_the_override_example_of_the_main_job_runs(tmp_path):
    """Two ranks from the layout alone (locally tasks_per_node follows it); 2 steps keep it short."""
    argv = [*shlex.split(RUN_EXAMPLE)[1:], "--algorithm.steps", "2", "--run_root", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "hpcrl", *argv], cwd=REPO, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("run dir: ")
    assert "step 2/2" in done.stdout + done.stderr


def test_the_readme_is_short_and_links_every_docs_page():
    """What it is, the two commands, the stages, the commands and the architecture fit one page a
    newcomer reads (<= 250 lines); the rest lives in docs/, each page linked from it."""
    assert len(README.splitlines()) <= 250
    assert DOC_PAGES
    for page in DOC_PAGES:
        assert f"](docs/{page.name})" in README, page.name
