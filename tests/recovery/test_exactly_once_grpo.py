"""Exactly-once resume of the REAL tiny GRPO job (megatron actor, reshard engine, HF rollout, async
sharded checkpoints): 40 steps straight vs the same run SIGKILLed at a random step after a checkpoint and
rerun (`resume: auto` picks up `latest`). Final parameters and AdamW state are bitwise equal, and
metrics.jsonl holds every step exactly once with bitwise equal values (wall-clock metrics aside) — across
epoch boundaries: 20 training prompts, 8 per step (templates/recovery/grpo_exactly_once.yaml)."""

from __future__ import annotations

import pytest

from tests.recovery._runs import (
    TEMPLATES,
    assert_kill_and_rerun_is_exactly_once,
    latest_step,
    metric_rows,
    run_dir_of,
    start_run,
)

TEMPLATE = TEMPLATES / "grpo_exactly_once.yaml"


@pytest.mark.heavy
@pytest.mark.slow
def test_sigkill_at_a_random_step_then_resume_equals_the_uninterrupted_run(tmp_path):
    assert_kill_and_rerun_is_exactly_once(TEMPLATE, tmp_path, steps=40, every=4, train_size=20, batch=8)


@pytest.mark.heavy
def test_a_rerun_without_any_checkpoint_logs_every_step_once(tmp_path):
    """A run that dies before its first checkpoint is redone from step 0: the earlier attempt's
    records are dropped, not kept beside the new ones."""
    no_checkpoints = (
        "--algorithm.steps",
        "3",
        "--checkpoint.every_steps",
        "0",
        "--checkpoint.save_on_exit",
        "false",
        "--checkpoint.export_hf",
        "false",
    )
    for attempt in ("first", "second"):
        log = tmp_path / f"{attempt}.log"
        run = start_run(TEMPLATE, tmp_path / "run", *no_checkpoints, log=log)
        assert run.wait(timeout=300) == 0, log.read_text()[-3000:]
    run_dir = run_dir_of(tmp_path / "run")
    assert latest_step(run_dir / "checkpoints") is None
    assert [r["step"] for r in metric_rows(run_dir)] == [0, 1, 2, 3]  # + the final evaluation
