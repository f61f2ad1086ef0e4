"""Exactly-once resume of on-policy distillation (the RL job with a frozen teacher role): the GRPO
exactly-once run (templates/recovery/grpo_exactly_once.yaml, 16 steps) as `algorithm.name: distill` from sft_tiny's
export on the copy task, SIGKILLed at a random step after a checkpoint and rerun: bitwise the
uninterrupted run's metrics, final parameters, AdamW state and HF export. The teacher is not
checkpointed (frozen, reloaded from its directory), so this shows the resumed student sees the same
teacher scores."""

from __future__ import annotations

import pytest

from tests.recovery._runs import TEMPLATES, assert_kill_and_rerun_is_exactly_once


@pytest.mark.heavy
@pytest.mark.slow
def test_distill_sigkilled_after_a_checkpoint_then_rerun_equals_the_uninterrupted_run(
    tmp_path, sft_copy_export
):
    teacher = sft_copy_export  # the session's SFT policy on the copy task (tests/conftest.py)
    template = tmp_path / "distill_exactly_once.yaml"
    template.write_text(
        f"extends: {TEMPLATES / 'grpo_exactly_once.yaml'}\nname: distill_exactly_once\n"
        f"algorithm: {{name: distill, teacher_path: {teacher}, dynamic_sampling: false, steps: 16, eval_every: 5}}\n"
    )
    assert_kill_and_rerun_is_exactly_once(template, tmp_path, steps=16, every=4, train_size=20, batch=8)
