"""`hpcrl ckpt export CKPT --hf DIR` tried as a new user would (2026-12-02): every case was a traceback or a
silent overwrite, and is now one line, exit 2 (exit 1 for a damaged checkpoint, as `check` says it),
with nothing written. DIR follows the output-directory rule of --sweep_dir (hpcrl.config.output_dirs)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcrl.cli import main
from tests.hostile_paths import Sandbox, hostile_paths

pytestmark = pytest.mark.heavy  # its shared fixtures train or spawn for seconds (launch/test.sh --quick)

REPO = Path(__file__).resolve().parents[2]
QUIET = ("--logging.tensorboard", "false", "--logging.plot", "false", "--logging.progress", "false")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The checkpoints of 2 steps of the tiny GRPO job (a model config in the manifest, as export needs)."""
    root = tmp_path_factory.mktemp("export")
    cmd = [sys.executable, "-m", "hpcrl", "run", str(REPO / "templates" / "grpo_tiny.yaml")]
    cmd += ["--run_root", str(root / "runs"), "--algorithm.steps", "2", "--algorithm.eval_every", "0", *QUIET]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [found] = (root / "runs").glob("grpo_tiny/*/checkpoints")
    return found


def export(capsys, checkpoint: Path, hf: object, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["ckpt", "export", str(checkpoint), "--hf", str(hf), *extra])
    return code, capsys.readouterr().err


def one_line(err: str) -> bool:
    return "Traceback" not in err and len([line for line in err.splitlines() if line.startswith("  - ")]) <= 1


def test_an_export_is_written_and_replaced_only_with_force(checkpoint, tmp_path, capsys):
    out = tmp_path / "hf"
    assert export(capsys, checkpoint, out)[0] == 0
    (out / "config.json").write_text("{}")  # the user's edit must survive a second export
    code, err = export(capsys, checkpoint, out)
    assert code == 2 and "--hf: " in err and "--force replaces it" in err and one_line(err)
    assert (out / "config.json").read_text() == "{}"
    assert export(capsys, checkpoint, out, "--force")[0] == 0
    assert (out / "config.json").read_text() != "{}"


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("proc", "cannot write"),
        ("file", "is a file, not a directory"),
        ("under_file", "lies under"),
        ("newline", "non-printable character '\\n'"),
        ("symlink", "symbolic link"),
        ("foreign", "not an HF export directory"),
    ],
)
def test_a_dir_that_cannot_be_an_export_is_one_line_exit_2(checkpoint, tmp_path, capsys, case, message):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "victim").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "victim")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "thesis.tex").write_text("x")
    hf = {
        "proc": Path("/proc/1/hf-export"),
        "file": tmp_path / "a_file",
        "under_file": tmp_path / "a_file" / "hf",
        "newline": tmp_path / "a\nb",
        "symlink": tmp_path / "link" / "hf",
        "foreign": tmp_path / "folder",
    }[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, err = export(capsys, checkpoint, hf)
    assert code == 2 and "--hf: " in err and message in err and one_line(err), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_damaged_checkpoint_is_one_line_exit_1_as_check_says_it(checkpoint, tmp_path, capsys):
    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoint, damaged)
    [shard, *_] = sorted(damaged.glob("step_*/rank_*.h5"))
    shard.write_bytes(shard.read_bytes()[:-1])
    code, err = export(capsys, damaged, tmp_path / "hf")
    assert code == 1 and err.startswith("hpcrl ckpt export: CORRUPT: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and not (tmp_path / "hf").exists()
    capsys.readouterr()
    assert main(["ckpt", "check", str(damaged)]) == 1
    assert capsys.readouterr().err.startswith("hpcrl ckpt check: CORRUPT: ")


def test_a_checkpoint_without_the_model_asked_for_names_the_prefix(checkpoint, tmp_path, capsys):
    code, err = export(capsys, checkpoint, tmp_path / "hf", "--prefix", "critic.")
    assert code == 2 and "--prefix: " in err and one_line(err) and not (tmp_path / "hf").exists()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_hostile_hf_dir_is_refused_in_one_line_or_written_only_where_it_leads(
    checkpoint, tmp_path, capsys, data
):
    sandbox = Sandbox.make(tmp_path / "sandbox")
    path = data.draw(hostile_paths(sandbox))
    before = sandbox.listing()
    code, err = export(capsys, checkpoint, path, "--force")
    sandbox.check(path, code, err, "--hf", before)
