"""The run's lifecycle (hpcrl.lifecycle): the one owner of a rank's stop signals, with real
signals. Under submitit (faked: its handler object) it takes USR2 and TERM; after the run the warning
signals are ignored and the others given back."""

from __future__ import annotations

import os
import signal

from hpcrl.lifecycle import Lifecycle


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
            os.kill(os.getpid(), signal.SIGTERM)
            assert lifecycle.terminating and lifecycle.interrupted_by is None
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN  # a late warning cannot requeue or kill
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) == before[signal.SIGINT]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_an_inert_lifecycle_reads_nothing_and_the_entrypoint_reports_how_it_stopped():
    lifecycle = Lifecycle()  # what a direct call of a job (tests) gets
    assert not lifecycle.take_save_request() and not lifecycle.terminating
    lifecycle.request_save()
    assert lifecycle.take_save_request()
    assert not lifecycle.wants_requeue and not lifecycle.stopped
    lifecycle.stop_for_requeue()
    lifecycle.stop_for_termination()
    assert lifecycle.wants_requeue and lifecycle.stopped
