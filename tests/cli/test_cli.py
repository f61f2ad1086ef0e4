"""The command line as a user meets it: short help, the config reference, "did you mean" for mistyped
keys, errors that name the file at fault, quiet ends of a closed pipe, and the progress bar."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.cli import app as cli
from hpcrl.config.schema import leaf_types
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.progress import DelayedProgress

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "templates/grpo_tiny.yaml")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """cli.main in this process; --help and --help-config end in SystemExit like argparse's --help."""
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as end:
        code = end.code
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_commands_and_the_flags_a_user_needs(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and "typical use:" in out and "hpcrl submit --help-config" in out
    assert "jsonargparse" not in out and "module" not in out  # what the tool does, not how it is built
    for command in cli.COMMANDS:
        assert f"    {command} " in out
    code, out, _ = run_cli(capsys, "submit", "--help")
    assert code == 0 and len(out.splitlines()) < 45, out
    for flag in ("--dry-run", "--sweep_dir", "--help-config", "--<dotted.key> VALUE"):
        assert flag in out
    assert "--cluster.tasks_per_node" not in out and "Override" not in out  # no per-key lines


@pytest.mark.heavy
def test_help_config_documents_every_key_from_its_field_docstring(capsys):
    code, out, _ = run_cli(capsys, "submit", "--help-config")
    assert code == 0
    lines = out.splitlines()
    for key in leaf_types(ExperimentConfig):
        heads = [i for i, line in enumerate(lines) if line.startswith(f"  --{key}  ")]
        assert len(heads) == 1, key
        assert lines[heads[0] + 1].startswith("      ") and lines[heads[0] + 1].strip(), f"{key} has no doc"
    assert "  --cluster.nodes  int in [1, 2^20] = 1\n      Nodes per array element." in out
    assert "  --cluster.executor  one of ['local', 'slurm'] = local" in out
    code, out, _ = run_cli(capsys, "expand", "--help-config", "optim")
    assert code == 0 and "--optim.lr  float >= 0 = " in out and "--cluster." not in out
    code, _, err = run_cli(capsys, "run", "--help-config", "clustr")
    assert code == 2 and "command line:--help-config: no config key 'clustr' (did you mean 'cluster'?)" in err


def test_mistyped_command_line_keys_get_the_closest_key(capsys, tmp_path):
    code, _, err = run_cli(capsys, "expand", TINY, "--algorithm.nmae", "grpo", "--optim.lrr=1e-3")
    assert code == 2 and "hpcrl: 2 problem(s):" in err
    assert "command line:--algorithm.nmae: unknown option (did you mean '--algorithm.name'?)" in err
    assert "command line:--optim.lrr: unknown option (did you mean '--optim.lr'?)" in err
    code, _, err = run_cli(capsys, "submit", TINY, "--dry-rnu", "--sweep_dir", tmp_path / "sw")
    assert code == 2 and "(did you mean '--dry-run'?)" in err and not (tmp_path / "sw").exists()
    code, _, err = run_cli(capsys, "status", tmp_path, "--jsn")
    assert code == 2 and "(did you mean '--json'?)" in err


@pytest.mark.heavy
def test_a_closed_pipe_ends_quietly_like_git_log_piped_to_head(tmp_path):
    """Enough JSON lines that the reader is gone while hpcrl still writes (a pipe holds 64 KiB)."""
    template = tmp_path / "t.yaml"
    template.write_text(f"extends: {TINY}\nsweep: {{grid: {{seed: {list(range(200))}}}}}\n")
    err = tmp_path / "err"
    pipeline = f"{sys.executable} -m hpcrl expand --json {template} 2>{err} | head -1 >/dev/null"
    done = subprocess.run(
        ["bash", "-c", f"{pipeline}; echo ${{PIPESTATUS[0]}}"], capture_output=True, text=True, cwd=REPO
    )
    assert err.read_text() == ""  # no BrokenPipeError traceback, no "Exception ignored"
    assert done.stdout.strip() == str(cli.BROKEN_PIPE_EXIT)


@pytest.mark.parametrize(
    "argv", [["expand", TINY], ["submit", "--dry-run", TINY], ["plan", TINY], ["--help"]], ids=lambda a: a[0]
)
def test_commands_that_read_configs_import_no_torch_transformers_or_megatron(argv):
    """They answer in ~0.5 s of CPU; transformers alone is another ~0.5 s (once imported by the tiny
    tokenizer's module for a constant every config rule reads), torch ~1.3 s, megatron-core more."""
    child = (
        "import sys\nfrom hpcrl.cli import main\ntry:\n    code = main(sys.argv[1:])\n"
        "except SystemExit as end:\n    code = end.code\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'megatron', 'h5py'})\n"
        "print(code, heavy, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", child, *argv], capture_output=True, text=True, cwd=REPO)
    assert done.stderr.splitlines()[-1] == "0 []", done.stderr[-2000:]


def test_hpcrl_sbatch_help_is_exit_0_and_no_arguments_exit_2():
    wrapper = REPO / "launch" / "hpcrl-sbatch"
    shown = subprocess.run([wrapper, "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "hpcrl-sbatch TEMPLATE" in shown.stdout
    bare = subprocess.run([wrapper], capture_output=True, text=True)
    assert bare.returncode == 2 and "hpcrl-sbatch TEMPLATE" in bare.stderr


def test_a_missing_base_and_an_unknown_profile_name_the_file_that_named_them(capsys, tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text("extends: base/missing.yaml\n")
    code, _, err = run_cli(capsys, "expand", child)
    assert code == 2 and f"{child}:extends: '{tmp_path / 'base/missing.yaml'}' not found" in err
    (tmp_path / "base.yaml").write_text("cluster: {profile: a100}\n")
    child.write_text("extends: base.yaml\nseed: 3\n")
    code, _, err = run_cli(capsys, "expand", child)
    assert code == 2 and f"{tmp_path / 'base.yaml'}:cluster.profile: unknown profile 'a100'" in err


@pytest.mark.parametrize(
    ("delay_s", "terminal", "shown"), [(0, True, True), (60, True, False), (0, False, False)]
)
def test_the_progress_bar_appears_after_its_delay_on_a_terminal_only(delay_s, terminal, shown):
    from rich.console import Console

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=terminal, width=100)
    with DelayedProgress(delay_s=delay_s, console=console) as track:
        assert sum(track(range(5000), 5000, "writing configs")) == sum(range(5000))
    assert ("writing configs" in screen.getvalue()) == shown


def test_local_ranks_follow_the_layout_unless_set(capsys, tmp_path):
    """`hpcrl run T --parallel.tensor 2` needs no --cluster.tasks_per_node: locally the layout says it."""
    from hpcrl.experiment.resolve import resolve

    assert resolve(TINY, {"parallel.tensor": 2}).elements[0].config.cluster.tasks_per_node == 2
    assert (
        resolve(TINY, {"parallel.data": 2, "placement.kind": "split", "algorithm.kl_coef": 0.05})
        .elements[0]
        .config.cluster.tasks_per_node
        == 4
    )
    code, _, err = run_cli(capsys, "expand", TINY, "--parallel.tensor", "2", "--cluster.tasks_per_node", "1")
    assert code == 2 and "layout mismatch" in err  # set by hand: kept, and checked
    slurm = ["--cluster.executor", "slurm", "--cluster.partition", "debug", "--parallel.tensor", "2"]
    code, _, err = run_cli(capsys, "expand", TINY, *slurm)
    assert code == 2 and "layout mismatch" in err  # on Slurm it is a resource request: never guessed
    assert os.environ.get("PATH")


def test_main_takes_paths_in_argv_as_subprocess_does(capsys):
    """`cli.main([..., Path(...)])` was an AttributeError (`Path.startswith`) in the option check."""
    template = Path(__file__).resolve().parents[2] / "templates" / "grpo_tiny.yaml"
    assert cli.main(["expand", template, "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["index"] == 0
