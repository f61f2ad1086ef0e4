"""Save triggers: Slurm durations, a real SIGUSR1, the time-limit rule, agreement across gloo ranks."""

from __future__ import annotations

import os
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcrl.ckpt.trigger import SaveTrigger, parse_slurm_duration
from hpcrl.distributed.spawn import run_ranks
from hpcrl.lifecycle import Lifecycle
from tests.ckpt._rank_fns import nccl_save_collectives, trigger_agreement


@given(st.integers(0, 30), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_slurm_durations_parse_in_every_form(days, hours, minutes, seconds):
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    assert parse_slurm_duration(f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}") == total
    assert parse_slurm_duration(f"{days * 24 + hours}:{minutes:02d}:{seconds:02d}") == total
    if days == hours == 0:
        assert parse_slurm_duration(f"{minutes}:{seconds:02d}") == total


def test_unlimited_and_garbage():
    assert parse_slurm_duration("UNLIMITED") is None
    with pytest.raises(ValueError, match="not a Slurm duration: '1h'"):
        parse_slurm_duration("1h")


def test_a_real_sigusr1_requests_save_and_stop_at_the_next_boundary():
    """The run's lifecycle owns the handler; the trigger reads it at the step boundary."""
    lifecycle = Lifecycle()
    trigger = SaveTrigger(every_steps=0, signals=lifecycle)
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        with lifecycle.installed():
            assert not trigger.decide(1, None).save
            os.kill(os.getpid(), signal.SIGUSR1)
            decision = trigger.decide(2, None)
            assert decision.save and decision.stop and decision.requeue
            assert decision.reasons == ("requested",)
            assert not trigger.decide(3, None).save  # the request is consumed
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN  # a late warning cannot kill the process
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_real_sigint_saves_and_stops_without_a_requeue_and_a_second_one_interrupts():
    lifecycle = Lifecycle()
    trigger = SaveTrigger(every_steps=0, signals=lifecycle)
    previous = signal.getsignal(signal.SIGINT)
    with lifecycle.installed():
        os.kill(os.getpid(), signal.SIGINT)
        decision = trigger.decide(5, None)
        assert decision.save and decision.stop and not decision.requeue
        assert decision.reasons == ("terminating",) and lifecycle.interrupted_by == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is previous  # given back after the run


def test_time_limit_rule_uses_the_slowest_step_and_save():
    now = [0.0]
    trigger = SaveTrigger(every_steps=10, time_left_s=100.0, safety=1.5, clock=lambda: now[0])
    trigger.record_step(20.0)
    trigger.record_save(10.0)
    now[0] = 50.0  # 50 s left >= 1.5 * 30 s
    assert trigger.decide(3, None) == trigger.decide(3, None).__class__(False, False, ())
    now[0] = 56.0  # 44 s left < 45 s: save now and stop
    decision = trigger.decide(4, None)
    assert decision.save and decision.stop and decision.reasons == ("deadline",)
    assert trigger.decide(10, None).reasons == ("periodic", "deadline")


def test_a_safety_of_0_never_saves_for_the_deadline_even_past_the_limit():
    """`checkpoint.deadline_safety: 0` is "no deadline save": past the time limit (time left < 0, an attempt
    whose signal came late) the deadline rule stays off; before, `left < 0 * ...` fired it there (seen as
    "saved (requested, deadline)" in the one-minute requeue element of 62bd346's clean-clone run)."""
    now = [0.0]
    trigger = SaveTrigger(every_steps=0, time_left_s=10.0, safety=0.0, clock=lambda: now[0])
    trigger.record_step(5.0)
    now[0] = 30.0  # 20 s past the limit
    assert trigger.decide(3, None).reasons == ()
    trigger.request()
    assert trigger.decide(4, None).reasons == ("requested",)


@pytest.mark.dist
def test_ranks_agree_when_only_one_rank_got_the_signal():
    decisions = run_ranks(trigger_agreement, 2)
    assert decisions == [(True, True, ("requested",))] * 2


def test_terminating_saves_and_stops_without_a_requeue_of_its_own():
    trigger = SaveTrigger(every_steps=0)
    trigger.terminate()
    decision = trigger.decide(3, None)
    assert decision.save and decision.stop and not decision.requeue
    assert decision.reasons == ("terminating",)
    fresh = SaveTrigger(every_steps=0)
    fresh.request()
    assert fresh.decide(4, None).requeue  # a warning signal alone still asks for the requeue


@pytest.mark.gpu
def test_the_save_collectives_run_on_an_nccl_group():
    """NCCL moves CUDA tensors only: the trigger's vote and the checkpoint's small collectives used to
    build CPU tensors, which fail on the NCCL group GPU jobs run on."""
    [(save, biggest, gathered)] = run_ranks(nccl_save_collectives, 1, backend="nccl")
    assert save and biggest == 5 and gathered == [{"rank": 0}]
