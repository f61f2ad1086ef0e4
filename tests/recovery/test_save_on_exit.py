"""The save on exit never commits a half-updated state: an exception (here a second Ctrl-C) inside a step's
optimizer update ends the run without a checkpoint of that state; the run resumes from its last one.

Before: run_steps' `finally` saved whatever the trainers held, labelled with the last completed step: the
weights of step 3's update under the name step_2, so a resume applied that update twice."""

from __future__ import annotations

import logging
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


def test_a_run_requeued_from_the_term_handler_makes_no_save_on_exit(monkeypatch, tmp_path, caplog):
    """The time limit's TERM beat the requested save and rank 0's handler requeued the job (submitit:
    `scontrol requeue`, SystemExit) between two steps: the other ranks are not saving with rank 0, so a
    save on exit (a collective) would only hang until Slurm's SIGKILL. The next attempt resumes from the
    last checkpoint instead."""
    from hpcrl.lifecycle import Lifecycle

    checkpointed: list[Lifecycle] = []
    real_says = Lifecycle.checkpoints_and_resumes
    monkeypatch.setattr(
        Lifecycle, "checkpoints_and_resumes", lambda self: (checkpointed.append(self), real_says(self))
    )
    real_run_steps = job.run_steps

    def run_steps(cfg, run_dir, parts, logger, one_step, *args, **kwargs):
        real_log, rows = logger.log, []

        def log(metrics: dict) -> None:
            real_log(metrics)
            rows.append(metrics)
            if len(rows) == 2:  # step 1 logged, between steps: what the requeue's SystemExit interrupts
                [lifecycle] = checkpointed
                lifecycle.requeued_unsaved = True
                raise SystemExit(0)

        monkeypatch.setattr(logger, "log", log)
        return real_run_steps(cfg, run_dir, parts, logger, one_step, *args, **kwargs)

    monkeypatch.setattr(job, "run_steps", run_steps)
    _assert_ends_unsaved_by(SystemExit, tmp_path, caplog, "rank 0 saved on exit alone")
    assert "not saved on exit: requeued at the time limit" in caplog.text
