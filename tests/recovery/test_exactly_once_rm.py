"""Exactly-once resume of the REAL tiny reward-model job (megatron trunk + scalar head, async sharded
checkpoints under "reward."): 16 steps straight vs the same run SIGKILLed at a random step after a
checkpoint and rerun (`resume: auto` picks up `latest`). Final parameters and AdamW state are bitwise
equal, metrics.jsonl holds every step exactly once with bitwise equal values (wall-clock metrics aside),
held-out evaluations included, and so are the two HF exports — across epoch boundaries: 20 training
pairs, 8 per step (templates/recovery/rm_exactly_once.yaml)."""

from __future__ import annotations

import pytest

from tests.recovery._runs import TEMPLATES, assert_kill_and_rerun_is_exactly_once


@pytest.mark.heavy
@pytest.mark.slow
def test_rm_sigkilled_after_a_checkpoint_then_rerun_equals_the_uninterrupted_run(tmp_path):
    template = TEMPLATES / "rm_exactly_once.yaml"
    assert_kill_and_rerun_is_exactly_once(template, tmp_path, steps=16, every=4, train_size=20, batch=8)
