"""Run identity in the jobs' checkpointing (hpcrl.stages.checkpointing): every checkpoint carries the run's
id, a resume refuses another run's checkpoint (two configs sharing one `checkpoint.dir` used to resume
each other silently), and `checkpoint.resume_from` starts a new run from another run's weights."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcrl.ckpt.commit import read_latest
from hpcrl.ckpt.manifest import read_manifest
from hpcrl.data.cursor import DataCursor, PromptSampler
from hpcrl.distributed.spawn import run_ranks
from hpcrl.errors import ConfigError
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.stages.checkpointing import StageCheckpointing
from hpcrl.stages.run_identity import load_or_create
from hpcrl.stages.stateful import DataCursorState
from tests.rl._identity_ranks import run_another_config_then_fine_tune
from tests.rl._job_ranks import tiny_config


def _cfg(shared: Path, **changes) -> ExperimentConfig:
    cfg = ExperimentConfig(**changes)
    cfg.checkpoint.dir = str(shared)
    cfg.checkpoint.async_save = False
    return cfg


def _run(cfg: ExperimentConfig, run_dir: Path, until: int) -> int:
    """Resume, 'train' to `until` saving every other step (no trainer: the step and the data cursor are
    the checkpointed state here); returns the step it started at."""
    data = SimpleNamespace(sampler=PromptSampler(list(range(10)), DataCursor(seed=5)))
    ckpt = StageCheckpointing(cfg, run_dir, {}, [DataCursorState(data)])
    start = ckpt.resume()
    for step in range(start, until):
        if (step + 1) % 2 == 0:
            ckpt.save(step + 1)
    ckpt.close(until)
    return start


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


def test_every_checkpoint_carries_the_run_id_and_the_same_run_resumes_with_more_steps(tmp_path):
    cfg = _cfg(tmp_path / "shared")
    assert _run(cfg, tmp_path / "a", 4) == 0
    run_id = load_or_create(tmp_path / "a", cfg).run_id
    assert read_manifest(read_latest(tmp_path / "shared")).state["run_id"] == run_id
    cfg.algorithm.steps = 6  # not part of the identity
    assert _run(cfg, tmp_path / "a", 6) == 4


def test_another_config_sharing_the_checkpoint_dir_is_refused_naming_both_runs(tmp_path):
    shared = tmp_path / "shared"
    assert _run(_cfg(shared, seed=0), tmp_path / "a", 4) == 0
    first = load_or_create(tmp_path / "a", _cfg(shared, seed=0))
    before = _tree(shared)
    with pytest.raises(ConfigError) as err:
        _run(_cfg(shared, seed=1), tmp_path / "b", 4)
    second = load_or_create(tmp_path / "b", _cfg(shared, seed=1))
    message = str(err.value)
    assert message.startswith(f"checkpoint.dir: {shared} holds another run's checkpoints")
    assert first.run_id in message and second.run_id in message
    assert f"fingerprint {first.fingerprint}" in message and f"fingerprint {second.fingerprint}" in message
    assert "checkpoint.resume_from" in message
    assert _tree(shared) == before  # nothing resumed, nothing set aside


def test_resume_from_a_root_without_checkpoints_is_a_config_error(tmp_path):
    cfg = _cfg(tmp_path / "own")
    cfg.checkpoint.resume_from = str(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="checkpoint.resume_from: cannot start from it"):
        _run(cfg, tmp_path / "run", 2)


@pytest.mark.heavy
@pytest.mark.slow
def test_a_fine_tune_starts_from_another_runs_weights_at_step_0_with_its_own_id(tmp_path):
    """Run A (seed 0) trains 2 steps into a shared dir; B (seed 1, lr 0) on the same dir is refused; B
    with `resume_from` = that dir and its own dir trains 1 step at lr 0 from A's weights: its parameters
    are A's, its optimizer is fresh (step count 1), and its checkpoint carries its own run id."""
    common = {"algorithm.eval_every": 0, "algorithm.prompts_per_step": 4, "checkpoint.async_save": False}
    shared, own = tmp_path / "shared", tmp_path / "own"
    first = tiny_config(**common, **{"algorithm.steps": 2, "checkpoint.dir": str(shared)})
    other = tiny_config(
        **common, **{"algorithm.steps": 1, "seed": 1, "optim.lr": 0.0, "checkpoint.dir": str(shared)}
    )
    tune = tiny_config(
        **common,
        **{"algorithm.steps": 1, "seed": 1, "optim.lr": 0.0, "checkpoint.dir": str(own)},
        **{"checkpoint.resume_from": str(shared)},
    )
    [out] = run_ranks(run_another_config_then_fine_tune, 1, first, other, tune, str(tmp_path), timeout_s=300)
    assert "holds another run's checkpoints" in out["refused"] and "checkpoint.dir" in out["refused"]
    assert out["tuned_steps"] == [0]
    assert out["same_params"] and out["params_compared"] > 0
    assert out["optim_steps"] == {1.0}
    assert out["tuned_run_id"] == out["tune_dir_run_id"] != out["first_run_id"]
