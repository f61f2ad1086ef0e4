"""The run's lifecycle (hpcrl.lifecycle): the one owner of a rank's stop signals, with real
signals. Under submitit (faked: its handler object) it takes USR2 and TERM; after the run the warning
signals are ignored and the others given back."""

from __future__ import annotations

import os
import signal

from hpcrl.lifecycle import AT_LIMIT_SLACK_S, Lifecycle


class _SubmititHandler:
    """What the lifecycle reads from submitit's SignalHandler (requeues left: yes)."""

    def has_timed_out(self) -> bool:
        return False

    def handle(self, signum, frame) -> None:  # pragma: no cover - a relayed signal never reaches it
        raise AssertionError("submitit's handler must not see a relayed signal")


def _saved(*signals: int) -> dict[int, object]:
    return {sig: signal.getsignal(sig) for sig in signals}


def test_under_submitit_usr2_asks_for_a_requeue_and_term_for_a_stop_and_both_are_handed_back():
    submitit = _SubmititHandler().handle
    before = _saved(signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
    signal.signal(signal.SIGUSR2, submitit)
    lifecycle = Lifecycle(submitit_handler=submitit)
    try:
        with lifecycle.installed():
            os.kill(os.getpid(), signal.SIGUSR2)
            assert lifecycle.take_save_request() and not lifecycle.take_save_request()
            assert not lifecycle.terminating
            lifecycle.stop_for_requeue()  # the save landed: the TERM after it only stops
            os.kill(os.getpid(), signal.SIGTERM)
            assert lifecycle.terminating and lifecycle.interrupted_by is None
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN  # a late warning cannot requeue or kill
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) == before[signal.SIGINT]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


class _RecordingHandler(_SubmititHandler):
    """submitit's handler as the lifecycle calls it to requeue: the signal it was called with."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def handle(self, signum, frame) -> None:
        self.calls.append(signum)


def _signals_to(lifecycle: Lifecycle, *events: int | str) -> None:
    """Deliver each signal to this process with `lifecycle` installed; "save": the entrypoint's save
    landed (`stop_for_requeue`)."""
    before = _saved(signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
    try:
        with lifecycle.installed():
            for event in events:
                if event == "save":
                    lifecycle.stop_for_requeue()
                else:
                    os.kill(os.getpid(), event)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


class _RequeueingRank0(_RecordingHandler):
    """submitit's handler on rank 0 once `scontrol requeue` took: it exits."""

    def handle(self, signum, frame) -> None:
        super().handle(signum, frame)
        raise SystemExit(-1)


def test_term_before_the_requested_save_landed_requeues_at_once_and_still_saves():
    """The loaded-node case: USR2 came during a slow start-up or a long step, no save landed before the
    time limit's TERM. Before: TERM only stopped, nobody requeued, and the element ended as TIMEOUT; also
    on a first attempt whose first save was still being written (nothing committed yet: the clean-clone
    CI run of 0b64e6d). Now the requeue comes at once, and the run still saves at the next step boundary
    (`terminating`): rank 0's exit from submitit's requeue is held until then, not raised mid-step."""
    for handler in (_RecordingHandler(), _RequeueingRank0()):
        lifecycle = Lifecycle(submitit_handler=handler.handle)
        lifecycle.checkpoints_and_resumes()  # what the stage's checkpointing says
        _signals_to(lifecycle, signal.SIGUSR2, signal.SIGTERM, signal.SIGTERM)  # the requeue's own TERM
        assert handler.calls == [signal.SIGUSR2]  # once: what the wrapper's requeue after a save calls
        assert lifecycle.requeued_at_term and lifecycle.terminating
        ending = lifecycle.term_requeue_ending
        assert ending is None if type(handler) is _RecordingHandler else isinstance(ending, SystemExit)


def test_term_requeues_nothing_after_the_save_landed_without_usr2_or_for_a_run_that_saves_nothing():
    cases = {
        "saved: the wrapper requeues": (True, [signal.SIGUSR2, "save", signal.SIGTERM]),
        "no USR2: preemption or scancel, Slurm decides": (True, [signal.SIGTERM]),
        "an entrypoint without checkpoints would only start over": (False, [signal.SIGUSR2, signal.SIGTERM]),
    }
    for case, (resumable, signals) in cases.items():
        handler = _RecordingHandler()
        lifecycle = Lifecycle(submitit_handler=handler.handle)
        if resumable:
            lifecycle.checkpoints_and_resumes()
        _signals_to(lifecycle, *signals)
        assert handler.calls == [] and not lifecycle.requeued_at_term, case
        assert lifecycle.terminating, case


def test_the_time_limits_term_requeues_even_when_no_usr2_came():
    """slurmctld's 30-s checks can miss USR2's window of a short limit (the one-minute requeue element
    ended TIMEOUT so in a clean-clone CI run of b4b367b): a TERM at the time limit, or within
    AT_LIMIT_SLACK_S before it, requeues as a TERM after USR2 does; one earlier (scancel, preemption)
    leaves the job to Slurm, and so does a run that saves nothing."""
    cases = {  # time left when the checkpointing started -> a requeue at TERM
        "past the limit": (-12.0, True, True),
        "inside the slack": (AT_LIMIT_SLACK_S - 1.0, True, True),
        "a minute before: scancel or preemption": (60.0, True, False),
        "limit unknown (squeue failed, or none)": (None, True, False),
        "at the limit, but nothing saved to resume": (-12.0, False, False),
    }
    for case, (time_left_s, resumable, requeued) in cases.items():
        handler = _RecordingHandler()
        lifecycle = Lifecycle(submitit_handler=handler.handle)
        if resumable:
            lifecycle.checkpoints_and_resumes(time_left_s=time_left_s)
        _signals_to(lifecycle, signal.SIGTERM, signal.SIGTERM)  # the requeue's own TERM: no second one
        assert handler.calls == ([signal.SIGUSR2] if requeued else []), case
        assert lifecycle.requeued_at_term == requeued and lifecycle.terminating, case


def test_an_inert_lifecycle_reads_nothing_and_the_entrypoint_reports_how_it_stopped():
    lifecycle = Lifecycle()  # what a direct call of a job (tests) gets
    assert not lifecycle.take_save_request() and not lifecycle.terminating
    lifecycle.request_save()
    assert lifecycle.take_save_request()
    assert not lifecycle.wants_requeue and not lifecycle.stopped
    lifecycle.stop_for_requeue()
    lifecycle.stop_for_termination()
    assert lifecycle.wants_requeue and lifecycle.stopped
