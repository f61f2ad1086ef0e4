"""What a rehearsal must show (hpcrl.rehearse.report), each failure caught and named."""

from __future__ import annotations

import pytest

from hpcrl.rehearse.report import check

RESUMED = "resumed from /r/checkpoints/step_00000002 at step 2\n"


def _rows(changes: dict | None = None) -> list[dict]:
    rows = [
        {
            "step": step,
            "time/step_s": 1.0,
            "time/generate_s": 0.2,
            "time/train_s": 0.7,
            "time/reshard_s": 0.1,
            "reshard/bytes_received": 1000.0,
            "reshard/verified_params": 15.0,
            "reshard/read_checksum": 10.0 + step,
            "mismatch/logprob_max": 1e-6,
            "actor/loss": 0.5,
            "actor/grad_norm": 1.0,
        }
        for step in range(3)
    ]
    for (step, key), value in (changes or {}).items():
        rows[step][key] = value
    return rows + [{"step": 3, "reward/heldout": 0.1, "time/elapsed_s": 3.0}]  # the final evaluation


def test_a_good_rehearsal_passes_and_reports_each_step():
    report = check(_rows(), 3, RESUMED, bound_bytes=1000)
    assert report.ok, report.failures
    lines = report.lines()
    assert len(lines) == 3 and "weights moved yes" in lines[2] and "reshard 1,000 B" in lines[0]


@pytest.mark.parametrize(
    ("changes", "log", "bound", "failure"),
    [
        ({(2, "reshard/read_checksum"): 11.0}, RESUMED, 1000, "step 2: reshard/read_checksum unchanged"),
        (
            {(0, "actor/grad_norm"): 0.0, (1, "actor/grad_norm"): 0.0},
            RESUMED,
            1000,
            "no update before the last step had a gradient",
        ),
        ({(1, "reshard/verified_params"): 0.0}, RESUMED, 1000, "step 1: reshard/verified_params missing"),
        (
            {(0, "reshard/bytes_received"): 999.0},
            RESUMED,
            1000,
            "step 0: reshard/bytes_received 999.0 != bound",
        ),
        ({(1, "actor/loss"): float("nan")}, RESUMED, 1000, "step 1: actor/loss = nan"),
        ({}, "started fresh\n", 1000, "did not resume from the step-2 checkpoint"),
    ],
)
def test_each_failure_is_named(changes, log, bound, failure):
    report = check(_rows(changes), 3, log, bound)
    assert not report.ok
    assert any(failure in f for f in report.failures), report.failures


def test_a_step_missing_or_logged_twice_fails():
    rows = _rows()
    assert any("steps [0, 1]" in f for f in check(rows[:2] + rows[3:], 3, RESUMED, None).failures)
    assert any("steps [0, 1, 1, 2]" in f for f in check(rows + [dict(rows[1])], 3, RESUMED, None).failures)


def test_a_step_without_a_gradient_may_leave_the_weights_as_they_were():
    """GRPO groups that all scored alike give a zero gradient: the next sync reads the same weights, and
    that is right (the check is that every update that had a gradient reaches the rollout)."""
    rows = _rows({(0, "actor/grad_norm"): 0.0, (1, "reshard/read_checksum"): 10.0})
    report = check(rows, 3, RESUMED, bound_bytes=1000)
    assert report.ok, report.failures
