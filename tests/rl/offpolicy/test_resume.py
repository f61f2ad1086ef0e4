"""Exactly-once resume of the async placement: the REAL tiny GRPO job on a training rank and a rollout rank
(`hpcrl run`, one-step off-policy, async sharded checkpoints every 4 steps), 16 steps straight vs the same
run SIGKILLed at a random step after a checkpoint and rerun. The checkpoint holds the batch generated with
the previous weights and not yet trained, and the weight version: the resumed run trains on exactly that
batch, so final parameters, AdamW state and every step's metrics are bitwise the uninterrupted run's.

Its samples are multi-turn episodes against the built-in Calculator (tool_async_exactly_once.yaml, which
is grpo_async_exactly_once.yaml with an environment): the in-flight batch holds whole episodes, and the
rerun's environments (fresh worker processes) give the same observations. The single-turn colocated path
has its own exactly-once test (tests/recovery/test_exactly_once_grpo.py)."""

from __future__ import annotations

import pytest

from tests.recovery._runs import (
    TEMPLATES,
    assert_exactly_once,
    kill_after_a_checkpoint_and_rerun,
    metric_rows,
)

TEMPLATE = TEMPLATES / "tool_async_exactly_once.yaml"

pytestmark = pytest.mark.dist


@pytest.mark.heavy
@pytest.mark.slow
def test_sigkill_at_a_random_step_then_resume_equals_the_uninterrupted_async_run(tmp_path):
    runs = kill_after_a_checkpoint_and_rerun(TEMPLATE, tmp_path, steps=16, every=4)
    assert_exactly_once(runs, steps=16)
    rows = metric_rows(runs.resumed)[:16]
    # one-step off-policy all along, across the resume: every batch after the first is one version old
    assert [r["async/version_lag_max"] for r in rows] == [0.0] + [1.0] * 15, runs.context
    assert all(r["async/batch_version"] == max(0, r["step"] - 1) for r in rows), runs.context
