"""The save on exit never commits a half-updated state: an exception (here a second Ctrl-C) inside a step's
optimizer update ends the run without a checkpoint of that state; the run resumes from its last one.

Before: run_steps' `finally` saved whatever the trainers held, labelled with the last completed step: the
weights of step 3's update under the name step_2, so a resume applied that update twice."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import pytest
import torch

from hpcrl.cli import main
from hpcrl.rl import job

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "grpo_tiny.yaml"
QUIET = ("--logging.tensorboard", "false", "--logging.plot", "false", "--logging.progress", "false")
INTERRUPTED_STEP = 2


def _assert_ends_unsaved_by(exception: type[BaseException], tmp_path, caplog, why: str) -> None:
    """`hpcrl run` of 4 steps, no periodic checkpoint, ends by `exception` and committed no checkpoint."""
    argv = ["run", str(TEMPLATE), "--run_root", str(tmp_path), "--algorithm.steps", "4"]
    argv += ["--algorithm.eval_every", "0", "--checkpoint.every_steps", "0", *QUIET]
    with caplog.at_level(logging.WARNING), pytest.raises(exception):
        main(argv)
    [run_dir] = tmp_path.glob("grpo_tiny/*")
    assert not list((run_dir / "checkpoints").glob("step_*")), why


@pytest.fixture
def ctrl_c_inside_an_update(monkeypatch) -> None:
    """KeyboardInterrupt right after the first optimizer update of step INTERRUPTED_STEP has changed the
    weights (the rest of the step, its logging and bookkeeping, never happens)."""
    armed = {"now": False}
    real_step = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        result = real_step(self, *args, **kwargs)
        if armed["now"]:
            armed["now"] = False
            raise KeyboardInterrupt
        return result

    real_run_steps = job.run_steps

    def run_steps(cfg, run_dir, parts, logger, one_step, *args, **kwargs):
        def maybe_interrupted(index: int) -> dict:
            armed["now"] = index == INTERRUPTED_STEP
            return one_step(index)

        return real_run_steps(cfg, run_dir, parts, logger, maybe_interrupted, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    monkeypatch.setattr(job, "run_steps", run_steps)


def test_an_update_interrupted_midway_is_not_saved_on_exit(ctrl_c_inside_an_update, tmp_path, caplog):
    _assert_ends_unsaved_by(KeyboardInterrupt, tmp_path, caplog, "a half-updated state was committed")
    assert f"not saved on exit: step {INTERRUPTED_STEP + 1} was interrupted midway" in caplog.text


def test_a_run_stopped_between_steps_is_still_saved_on_exit(tmp_path):
    argv = ["run", str(TEMPLATE), "--run_root", str(tmp_path), "--algorithm.steps", "2"]
    assert main([*argv, "--algorithm.eval_every", "0", "--checkpoint.every_steps", "0", *QUIET]) == 0
    [run_dir] = tmp_path.glob("grpo_tiny/*")
    assert [p.name for p in (run_dir / "checkpoints").glob("step_*")] == ["step_00000002"]


class _SlurmJob:
    """The one boundary faked: submitit's job environment, whose `_requeue` runs `scontrol requeue` on
    the job around this process (tests/recovery/test_slurm_requeue.py does this on real Slurm)."""

    global_rank = 0

    def __init__(self) -> None:
        self.requeued: list[int] = []

    def _requeue(self, countdown: int) -> None:
        self.requeued.append(countdown)


def test_a_term_after_usr2_before_its_save_still_saves_and_requeues(monkeypatch, tmp_path, caplog):
    """Submitit's USR2 and then the time limit's TERM reach rank 0 while step 2 ends, before the save
    USR2 asked for: the TERM hands the requeue to submitit's own handler (its real code: checkpoint,
    `scontrol requeue`, exit), the run still saves step 2 at that step boundary, and only then does
    rank 0 end as submitit ends a requeued job (SystemExit, no result). Before: submitit's exit came
    inside the TERM handler, mid-step, and the next attempt lost the step since the last checkpoint."""
    from submitit.core.job_environment import SignalHandler
    from submitit.helpers import DelayedSubmission

    from hpcrl.launcher.element import LAUNCHER_STATE, ElementTask

    element_dir = tmp_path / "element"
    element_dir.mkdir()
    delayed = DelayedSubmission(ElementTask(), "config.yaml", str(element_dir))
    delayed.set_timeout(timeout_min=60, max_num_timeout=3)
    slurm_job = _SlurmJob()
    paths = type("JobPaths", (), {"submitted_pickle": tmp_path / "submitted.pkl"})()
    submitit_handler = SignalHandler(slurm_job, paths, delayed)  # type: ignore[arg-type]
    monkeypatch.setattr(signal, "getsignal", lambda sig: submitit_handler.checkpoint_and_try_requeue)
    real_run_steps = job.run_steps

    def run_steps(cfg, run_dir, parts, logger, one_step, *args, **kwargs):
        real_log, rows = logger.log, []

        def log(metrics: dict) -> None:
            real_log(metrics)
            rows.append(metrics)
            if len(rows) == 2:  # step 2 done, its save not yet made: the warning, then the time limit
                os.kill(os.getpid(), signal.SIGUSR2)
                os.kill(os.getpid(), signal.SIGTERM)

        monkeypatch.setattr(logger, "log", log)
        return real_run_steps(cfg, run_dir, parts, logger, one_step, *args, **kwargs)

    monkeypatch.setattr(job, "run_steps", run_steps)
    argv = ["run", str(TEMPLATE), "--run_root", str(tmp_path / "runs"), "--algorithm.steps", "4"]
    argv += ["--algorithm.eval_every", "0", "--checkpoint.every_steps", "0", *QUIET]
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == -1  # submitit's requeue exit, raised after the save
    assert slurm_job.requeued == [3]  # once: the requeue's own TERM does not requeue again
    [run_dir] = (tmp_path / "runs").glob("grpo_tiny/*")
    assert [p.name for p in (run_dir / "checkpoints").glob("step_*")] == ["step_00000002"]
    assert "step 2: saved (requested, terminating), stopping: the job is ending" in caplog.text
    assert json.loads((element_dir / LAUNCHER_STATE).read_text())["state"] == "REQUEUED"
