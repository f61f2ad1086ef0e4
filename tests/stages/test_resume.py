"""The RL job's resume (hpcrl.stages.checkpointing.StageCheckpointing) goes through the verified loader: a torn
manifest, or a `latest` that is missing, empty or garbled, resumes from the newest committed checkpoint
that verifies instead of crashing the job or starting it over."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from hpcrl.ckpt.commit import REJECTED, committed
from hpcrl.data.cursor import DataCursor, PromptSampler
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.stages.checkpointing import StageCheckpointing
from hpcrl.stages.stateful import DataCursorState
from tests.stages._sampling import cursor_after


@pytest.fixture(autouse=True)
def _keep_sigusr1():
    """StageCheckpointing installs a SIGUSR1 handler in the main thread; give pytest its own back."""
    before = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, before)


def _job(run_dir, until: int) -> int:
    """One (re)run: resume, then 'train' (advance the data cursor by 3 rows per step) and save every
    other step up to `until`. The checkpointed state here is the step and the data cursor (no trainer:
    the real trainers' tensors go through the same loader, tests/rl/test_job.py). Returns the start."""
    cfg = ExperimentConfig()
    cfg.checkpoint.async_save = False
    cfg.checkpoint.keep_last = 3
    data = SimpleNamespace(sampler=PromptSampler(list(range(10)), DataCursor(seed=5)))
    ckpt = StageCheckpointing(cfg, run_dir, {}, [DataCursorState(data)])
    start = ckpt.resume()
    assert data.sampler.cursor.to_dict() == _cursor_after(start)
    for step in range(start, until):
        data.sampler.next_batch(3)
        if (step + 1) % 2 == 0:
            ckpt.save(step + 1)
    ckpt.close(until)
    return start


def _cursor_after(steps: int) -> dict:
    return cursor_after(steps, seed=5, batch=3)


def _torn_manifest(root):
    path = root / "step_00000006" / "manifest.json"
    path.write_bytes(path.read_bytes()[:-30])


def _damage_latest(text):
    def damage(root):
        (root / "latest").unlink()
        if text is not None:
            (root / "latest").write_text(text)

    return damage


DAMAGE = {
    # what is done to the checkpoints of steps 2, 4, 6 -> the step the next run resumes at
    "torn_manifest": (_torn_manifest, 4),
    "latest_deleted": (_damage_latest(None), 6),
    "latest_empty": (_damage_latest(""), 6),
    "latest_garbled": (_damage_latest("step_0000\x00006"), 6),
    "latest_names_no_dir": (_damage_latest("step_00000007"), 6),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_resume_finds_the_newest_good_checkpoint_and_the_run_goes_on(tmp_path, kind):
    damage, resumes_at = DAMAGE[kind]
    assert _job(tmp_path, 6) == 0
    damage(tmp_path / "checkpoints")
    assert _job(tmp_path, 8) == resumes_at
    assert _job(tmp_path, 8) == 8  # the rerun committed its steps: the next one resumes at the end
    root = tmp_path / "checkpoints"
    assert [s for s, _ in committed(root)][:2] == [8, 6]
    assert (root / "latest").read_text().strip() == "step_00000008"
    assert len([p for p in root.iterdir() if REJECTED in p.name]) == (kind == "torn_manifest")


def test_with_nothing_committed_the_run_starts_at_zero(tmp_path):
    assert _job(tmp_path, 2) == 0
    assert _job(tmp_path / "other", 0) == 0
