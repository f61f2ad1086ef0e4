"""Exactly-once resume of the REAL tiny offline DPO job (megatron policy + frozen reference, async sharded
checkpoints): 16 steps straight vs the same run SIGKILLed at a random step after a checkpoint and rerun
(`resume: auto` picks up `latest`). Final parameters and AdamW state are bitwise equal, and metrics.jsonl
holds every step exactly once with bitwise equal values (wall-clock metrics aside), held-out evaluations
included — across epoch boundaries: 20 training pairs, 8 per step (templates/recovery/dpo_exactly_once.yaml)."""

from __future__ import annotations

import signal

import pytest

from tests.recovery._runs import (
    TEMPLATES,
    assert_kill_and_rerun_is_exactly_once,
    latest_step,
    metric_rows,
    run_dir_of,
    start_run,
    steps_logged,
)
from tests.waiting import wait_until

TEMPLATE = TEMPLATES / "dpo_exactly_once.yaml"
STEPS = 16


@pytest.mark.heavy
@pytest.mark.slow
def test_dpo_sigkilled_after_a_checkpoint_then_rerun_equals_the_uninterrupted_run(tmp_path):
    assert_kill_and_rerun_is_exactly_once(TEMPLATE, tmp_path, steps=STEPS, every=4, train_size=20, batch=8)


@pytest.mark.heavy
@pytest.mark.slow
def test_kto_sigkilled_after_a_checkpoint_then_rerun_equals_the_uninterrupted_run(tmp_path):
    """The KTO loss (unpaired rows: 40 from 20 pairs, 16 per step; z0 from the step's mismatched rows)."""
    template = TEMPLATES / "kto_exactly_once.yaml"
    assert_kill_and_rerun_is_exactly_once(template, tmp_path, steps=STEPS, every=4, train_size=40, batch=16)


@pytest.mark.heavy
@pytest.mark.slow
def test_dpo_saves_and_stops_on_sigusr1_then_a_rerun_finishes_with_each_step_once(tmp_path):
    """The Slurm warning signal (`--signal=B:USR1@N`) reaches DPO's save trigger: it saves at the next
    step boundary (no periodic saves here), stops, and the rerun resumes exactly there."""
    only_signal = ("--checkpoint.every_steps", "0")
    runs = tmp_path / "runs"  # a run root holds run directories only (the logs lie beside it)
    run = start_run(TEMPLATE, runs, *only_signal, log=tmp_path / "run.log")
    wait_until(
        lambda: (
            run.poll() is not None  # ended: the exit code below says how
            or (any(runs.glob("*/*/metrics.jsonl")) and steps_logged(run_dir_of(runs)) >= 3)
        ),
        300,
        "3 logged steps",
        poll_s=0.01,
    )
    run.send_signal(signal.SIGUSR1)
    assert run.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    run_dir = run_dir_of(runs)
    stopped_at = latest_step(run_dir / "checkpoints")
    assert stopped_at is not None and 3 <= stopped_at < STEPS
    assert steps_logged(run_dir) == stopped_at  # saved at the boundary right after the last logged step
    assert f"step {stopped_at}: saved (requested), stopping for requeue" in (tmp_path / "run.log").read_text()
    rerun = start_run(TEMPLATE, runs, *only_signal, log=tmp_path / "rerun.log")
    assert rerun.wait(timeout=300) == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    assert f"at step {stopped_at}" in (tmp_path / "rerun.log").read_text()
    assert [r["step"] for r in metric_rows(run_dir)] == list(range(STEPS + 1))  # + the final evaluation
    assert latest_step(run_dir / "checkpoints") == STEPS  # save_on_exit
