"""Cheap pieces of the recovery path: metrics cut back on resume, and the requeue hook's bookkeeping."""

from __future__ import annotations

import json

import pytest

from hpcrl.launcher import element
from hpcrl.rl.checkpointing import cut_metrics_back


def test_metrics_are_cut_back_in_place_under_an_open_append_handle(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(json.dumps({"step": s, "loss": s / 3}) + "\n" for s in range(7)) + '{"step": 7, "lo'
    )
    with path.open("a") as logger:  # the metrics logger opened it before the resume
        assert cut_metrics_back(path, resume_step=4) == 4  # steps 4, 5, 6 and the torn line
        logger.write(json.dumps({"step": 4, "loss": 4 / 3}) + "\n")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[1]["loss"] == 1 / 3  # kept records byte for byte
    assert cut_metrics_back(tmp_path / "absent.jsonl", 3) == 0


@pytest.fixture
def clean_requeue_state(monkeypatch):
    monkeypatch.setattr(element, "_requeue_callbacks", [])
    monkeypatch.setattr(element, "_terminate_callbacks", [])
    monkeypatch.setattr(element, "_flags", {k: False for k in element._flags})


def test_a_signal_before_registration_reaches_the_callback_and_unregister_stops_it(clean_requeue_state):
    calls = []
    element._flags["signalled"] = True  # USR2 came while the entrypoint was still starting
    unregister = element.on_requeue(lambda: calls.append("request"))
    assert calls == ["request"]
    unregister()
    unregister()  # idempotent
    assert element._requeue_callbacks == []


def test_sigterm_reaches_terminate_callbacks_and_a_late_registration_too(clean_requeue_state):
    calls = []
    unregister = element.on_terminate(lambda: calls.append("first"))
    element._on_sigterm(element.TERMINATE_SIGNAL, None)
    assert calls == ["first"] and element._flags["terminating"]
    element.on_terminate(lambda: calls.append("late"))  # registered after the signal: told at once
    assert calls == ["first", "late"]
    unregister()
    assert len(element._terminate_callbacks) == 1
