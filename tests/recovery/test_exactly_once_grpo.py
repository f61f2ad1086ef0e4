"""Exactly-once resume of the REAL tiny GRPO job (megatron actor, reshard engine, HF rollout, async
sharded checkpoints): 40 steps straight vs the same run SIGKILLed at a random step after a checkpoint and
rerun (`resume: auto` picks up `latest`). Final parameters and AdamW state are bitwise equal, and
metrics.jsonl holds every step exactly once with bitwise equal values (wall-clock metrics aside) — across
epoch boundaries: 20 training prompts, 8 per step (templates/recovery/grpo_exactly_once.yaml)."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch

from tests.recovery._runs import (
    TEMPLATES,
    digest,
    final_tensors,
    latest_step,
    metric_rows,
    run_dir_of,
    start_run,
    steps_logged,
)

TEMPLATE = TEMPLATES / "grpo_exactly_once.yaml"
STEPS, EVERY, TRAIN_SIZE, BATCH = 40, 4, 20, 8


@pytest.mark.slow
def test_sigkill_at_a_random_step_then_resume_equals_the_uninterrupted_run(tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    kill_after = random.Random(seed).randint(EVERY + 1, STEPS - EVERY - 1)  # steps logged before the kill
    context = f"(kill after {kill_after} logged steps; seed {seed})"
    reference = start_run(TEMPLATE, tmp_path / "ref", log=tmp_path / "ref.log")
    victim = start_run(TEMPLATE, tmp_path / "run", log=tmp_path / "run.log")
    deadline = time.monotonic() + 100
    while victim.poll() is None and time.monotonic() < deadline:  # kill after a committed checkpoint
        root = tmp_path / "run"
        if any(root.glob("*/*/metrics.jsonl")):
            run_dir = run_dir_of(root)
            if steps_logged(run_dir) >= kill_after and latest_step(run_dir / "checkpoints"):
                break
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL, f"the run ended before the kill {context}"
    run_dir = run_dir_of(tmp_path / "run")
    killed_at = steps_logged(run_dir)
    resume_from = latest_step(run_dir / "checkpoints")
    assert resume_from is not None and 0 < resume_from <= killed_at < STEPS, (resume_from, killed_at, context)

    resumed = start_run(TEMPLATE, tmp_path / "run", log=tmp_path / "run.log")
    assert resumed.wait(timeout=120) == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert reference.wait(timeout=120) == 0, (tmp_path / "ref.log").read_text()[-3000:]
    assert f"at step {resume_from}" in (tmp_path / "run.log").read_text()  # it really resumed there

    rows, expected = metric_rows(run_dir), metric_rows(run_dir_of(tmp_path / "ref"))
    assert [r["step"] for r in rows] == list(range(STEPS + 1)), context  # once each; + final evaluation
    assert rows == expected, context  # bitwise: JSON floats round-trip exactly
    assert (resume_from * BATCH) // TRAIN_SIZE < (STEPS * BATCH) // TRAIN_SIZE  # epochs crossed after resume

    ref_state = final_tensors(run_dir_of(tmp_path / "ref") / "checkpoints")
    got_state = final_tensors(run_dir / "checkpoints")
    assert latest_step(run_dir / "checkpoints") == STEPS
    assert ref_state.keys() == got_state.keys()
    assert any(".optim.exp_avg_sq." in k for k in got_state) and any(".optim.step." in k for k in got_state)
    for name in ref_state:
        assert torch.equal(ref_state[name], got_state[name]), f"{name} differs {context}"
    assert digest(ref_state) == digest(got_state)
    print(f"killed after {killed_at} steps, resumed at {resume_from}, final sha256={digest(got_state)}")


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
    )
    for attempt in ("first", "second"):
        log = tmp_path / f"{attempt}.log"
        run = start_run(TEMPLATE, tmp_path / "run", *no_checkpoints, log=log)
        assert run.wait(timeout=120) == 0, log.read_text()[-3000:]
    run_dir = run_dir_of(tmp_path / "run")
    assert latest_step(run_dir / "checkpoints") is None
    assert [r["step"] for r in metric_rows(run_dir)] == [0, 1, 2, 3]  # + the final evaluation
