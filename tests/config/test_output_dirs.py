"""The one rule for a directory hpcrl creates or fills (hpcrl.config.output_dirs): never reached through
a symbolic link, never under a file, never someone else's non-empty folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcrl.config.output_dirs import HF_EXPORT_DIR, RUN_ROOT, SWEEP_DIR, output_dir_problem


@pytest.fixture
def sandbox(tmp_path) -> Path:
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "keep").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "victim")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("x")
    (tmp_path / "plain").write_text("x")
    (tmp_path / "empty").mkdir()
    return tmp_path


@pytest.mark.parametrize("kind", [SWEEP_DIR, RUN_ROOT, HF_EXPORT_DIR])
def test_new_and_empty_directories_are_fine(sandbox, kind):
    assert output_dir_problem(sandbox / "new" / "deeper", kind) is None
    assert output_dir_problem(sandbox / "empty", kind) is None


@pytest.mark.parametrize("tail", ["", "sub", "sub/deeper", "../victim"])
def test_a_symlink_anywhere_on_the_way_is_refused_naming_it(sandbox, tail):
    path = sandbox / "link" / tail if tail else sandbox / "link"
    problem = output_dir_problem(path, SWEEP_DIR)
    assert problem is not None and "symbolic link" in problem and str(sandbox / "victim") in problem


def test_proc_self_is_a_link(sandbox):
    assert "symbolic link" in output_dir_problem("/proc/self/x", SWEEP_DIR)


def test_a_file_or_a_path_under_one_is_refused(sandbox):
    assert output_dir_problem(sandbox / "plain", SWEEP_DIR) == "is a file, not a directory"
    assert "lies under" in output_dir_problem(sandbox / "plain" / "x", SWEEP_DIR)


def test_a_foreign_non_empty_folder_is_refused_and_what_it_holds_is_named(sandbox):
    problem = output_dir_problem(sandbox / "foreign", SWEEP_DIR)
    assert "not a sweep directory" in problem and "'notes.txt'" in problem


def test_each_kind_accepts_what_hpcrl_writes_into_it(sandbox):
    sweep = sandbox / "sweep"
    for name in ("configs", "sbatch", "slurm", "local"):
        (sweep / name).mkdir(parents=True)
    (sweep / "manifest.json").write_text("{}")
    (sweep / ".manifest.json.abc123.tmp").write_text("")  # an interrupted atomic write
    assert output_dir_problem(sweep, SWEEP_DIR) is None
    (sandbox / "runs" / "grpo_tiny").mkdir(parents=True)
    assert output_dir_problem(sandbox / "runs", RUN_ROOT) is None
    (sandbox / "runs" / "README").write_text("")  # a file: not one experiment's directory
    assert "README" in output_dir_problem(sandbox / "runs", RUN_ROOT)
    (sandbox / "hf").mkdir()
    (sandbox / "hf" / "config.json").write_text("{}")
    assert output_dir_problem(sandbox / "hf", HF_EXPORT_DIR) is None
    assert "config.json" in output_dir_problem(sandbox / "hf", SWEEP_DIR)


def test_a_symlinked_entry_of_a_run_root_is_not_an_experiment_directory(sandbox):
    (sandbox / "runs").mkdir()
    (sandbox / "runs" / "grpo_tiny").symlink_to(sandbox / "victim")
    assert "grpo_tiny" in output_dir_problem(sandbox / "runs", RUN_ROOT)


@pytest.mark.parametrize("text", ["a\nb", "a\x1b[31mb", "x" * 2000, ""])
def test_control_characters_and_bounds_are_the_path_rule(sandbox, text):
    assert output_dir_problem(text, SWEEP_DIR) is not None


PARTS = st.sampled_from(["link", "foreign", "plain", "empty", "victim", "new", "..", ".", "a\tb", "%x"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(PARTS, min_size=1, max_size=4))
def test_whatever_is_accepted_is_reached_without_a_link_and_is_not_foreign(sandbox, parts):
    path = sandbox.joinpath(*parts)
    problem = output_dir_problem(path, SWEEP_DIR)
    if problem is not None:
        return
    real = Path(os.path.realpath(path))
    assert real == Path(os.path.normpath(path))  # no link followed on the way
    assert not real.exists() or (real.is_dir() and not any(real.iterdir()))
