"""Cheap pieces of the recovery path: metrics cut back on resume, and the lifecycle's signal bookkeeping."""

from __future__ import annotations

import json
import signal

from hpcrl.ckpt.trigger import SaveTrigger
from hpcrl.lifecycle import REQUEUE_SIGNAL, TERMINATE_SIGNAL, Lifecycle
from hpcrl.stages.checkpointing import cut_metrics_back


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


class _Submitit:
    """Stands in for submitit's signal handler: requeues are left."""

    def has_timed_out(self) -> bool:
        return False

    def handler(self, signum, frame) -> None:  # pragma: no cover - never called here
        raise AssertionError("submitit's own handler must not run on a relayed signal")


def test_a_signal_before_the_trigger_looks_is_kept_until_it_does_and_is_consumed():
    lifecycle = Lifecycle(submitit_handler=_Submitit().handler)
    lifecycle._on_requeue(REQUEUE_SIGNAL, None)  # USR2 came while the entrypoint was still starting
    trigger = SaveTrigger(every_steps=0, signals=lifecycle)
    decision = trigger.decide(1, None)
    assert decision.stop and decision.requeue and decision.reasons == ("requested",)
    assert not trigger.decide(2, None).save  # consumed


def test_sigterm_under_submitit_saves_and_stops_without_a_requeue_of_ours():
    lifecycle = Lifecycle(submitit_handler=_Submitit().handler)
    lifecycle._on_terminate(TERMINATE_SIGNAL, None)
    trigger = SaveTrigger(every_steps=0, signals=lifecycle)
    for step in (3, 4):  # terminating is a state, not a one-off request
        decision = trigger.decide(step, None)
        assert decision.save and decision.stop and not decision.requeue


def test_the_lifecycle_takes_usr2_and_term_only_under_submitit():
    """Locally nobody sends USR2, and a local SIGTERM (`hpcrl cancel`) must end the rank at once."""
    before = {sig: signal.getsignal(sig) for sig in (REQUEUE_SIGNAL, TERMINATE_SIGNAL)}
    with Lifecycle().installed():
        assert {sig: signal.getsignal(sig) for sig in before} == before
