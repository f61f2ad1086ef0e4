"""The signals that stop a run, owned by one object per rank process: `Lifecycle`.

The entrypoint wrapper (hpcrl.launcher.element.run_element) creates it, installs its handlers for the
duration of the run and passes it to the entrypoint (`fn(cfg, run_dir, lifecycle=...)`), which hands it
to its save trigger (hpcrl.ckpt.trigger.SaveTrigger reads it at every step boundary). Handlers only set
flags: saving inside a handler could interrupt a collective, and ranks receive a signal at slightly
different moments, so the trigger turns the flags into one decision that all ranks share.

    signal  from                                          asks for
    USR2    submitit's --signal=USR2@N (Slurm, every rank) save, stop, requeue. Relayed: submitit's own
                                                          handler would requeue rank 0 at once, mid-step
    USR1    a plain `sbatch --signal=B:USR1@N`            save, stop, requeue
    TERM    Slurm ending the job under submitit           save, stop; Slurm requeues a preempted or
            (preemption, `scontrol requeue`, scancel)     requeued job itself, a cancelled one stays ended
    INT     Ctrl-C (the local launcher forwards it to     save, stop; a second INT interrupts at once
            every rank; an in-process run gets it         (KeyboardInterrupt)
            from the terminal)

A TERM after USR2 whose save has not landed (a slow start or a long step on a loaded node: the time limit
came first) requeues at once when the run checkpoints (`checkpoints_and_resumes`, said by its stage's
checkpointing), and the run still saves: every rank got the TERM, so all of them save at the next step
boundary and stop, inside Slurm's KillWait (SIGKILL comes that long after the TERM). The requeue comes
first because it cannot come after: a step longer than KillWait would be SIGKILLed with the element
unrequeued (TIMEOUT, the whole job ended), and the requeued job cannot start again before every process
of this attempt is gone (its nodes stay COMPLETING until then), so the save never races the next
attempt. submitit's handler ends rank 0 right after `scontrol requeue` (SystemExit); here that ending is
held (`term_requeue_ending`) and raised by the wrapper once the entrypoint returned, so rank 0 leaves no
collective half done. The next attempt resumes from that save, or from the last committed checkpoint
when SIGKILL came first, or starts over when there is none yet. A run that saves nothing is not
requeued: it would only start over. A save still in flight completes or is killed, atomically either
way (nothing half-written is ever `latest`). Requeues stay bounded by submitit's max_num_timeout. (A
scancel inside that last window is taken for the time limit: the job comes back once, and a second
scancel ends it.)

A TERM at the time limit with no USR2 before it is the same case: slurmctld checks limits every 30 s and
sends USR2 at the first check inside its window, so with a short limit the window can fall between two
checks, or the attempt's start-up outlast it (measured: an element of the one-minute requeue test ended
TIMEOUT, its last attempt never signalled). The run's checkpointing reads the job's time left when it
starts (`checkpoints_and_resumes(time_left_s)`); a TERM that comes no earlier than AT_LIMIT_SLACK_S before
that limit is the limit's, and requeues as above. An earlier TERM (preemption, `scontrol requeue`,
scancel) is Slurm's to decide, as before.

USR2 and TERM are taken over only under submitit (elsewhere nobody sends USR2, and a local SIGTERM, e.g.
`hpcrl cancel` of a local element, should end the rank at once). A signal that arrives before the
entrypoint looks is kept until it does. After the run the warning signals (USR1, USR2) are ignored: a
late one must not kill the finished process (Slurm would call the element FAILED); INT and TERM get
their previous handlers back.

The entrypoint reports how it stopped (`stop_for_requeue`, `stop_for_termination`); the wrapper then
asks submitit for the requeue, or leaves the job's fate to Slurm.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

REQUEUE_SIGNAL = signal.SIGUSR2
"""submitit's warning signal on Slurm (`--signal=USR2@<cluster.signal_delay_s>`)."""
WARNING_SIGNAL = signal.SIGUSR1
"""A plain sbatch warning signal (`--signal=B:USR1@N`)."""
TERMINATE_SIGNAL = signal.SIGTERM
"""Slurm's 'this job ends now' (preemption, requeue, cancel); SIGKILL follows KillWait seconds later."""
INTERRUPT_SIGNAL = signal.SIGINT
"""Ctrl-C."""
TERM_REQUEUE_SAID = (
    "the time limit came before the requested save: requeued; saving at the next step boundary "
    "(else the next attempt resumes from the last checkpoint, if any)"
)
"""What every rank logs when a TERM beat the save USR2 asked for (see the module docstring)."""
AT_LIMIT_SLACK_S = 5.0
"""A TERM this close to the time limit, or after it, is the limit's. Covers the time squeue took to answer
(its time left is older than the clock read after it) and its whole-second resolution."""


class Lifecycle:
    """One per rank process; see the module docstring. Without `install()` it is inert (a job called
    directly, e.g. by a test, still gets one to read)."""

    def __init__(self, submitit_handler: Callable[..., Any] | None = None) -> None:
        self.submitit_handler = submitit_handler
        """submitit's requeue handler when this rank runs under submitit on Slurm, else None."""
        self.interrupted_by: int | None = None
        """INT: the signal that asked this rank to stop, for the exit code (128 + it)."""
        self._save_requested = False
        self._requeue_asked = False  # USR2 came: a requeue is owed, after a save or (TERM first) at once
        self._resumable = False
        self._limit_at: float | None = None  # time.monotonic() of the job's time limit, when known
        self.requeued_at_term = False
        """TERM came before USR2's save landed: the requeue was handed to submitit from the TERM handler (the
        run goes on to save at the next step boundary and stop)."""
        self.term_requeue_ending: BaseException | None = None
        """What submitit's requeue raised on rank 0 at that TERM, held until the entrypoint returned:
        SystemExit once `scontrol requeue` took, UncompletedJobError when it refused (none left)."""
        self._terminating = False
        self._stop_for_requeue = False
        self._stopped = False
        self._previous: dict[int, Any] = {}

    @classmethod
    def for_this_process(cls) -> Lifecycle:
        """A lifecycle that knows whether submitit runs this process (its handler is on USR2)."""
        return cls(submitit_handler=_submitit_handler())

    # --- installation ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def installed(self) -> Iterator[Lifecycle]:
        """Own the signals for the duration of the block (main thread only: elsewhere Python cannot
        install handlers, and the lifecycle stays inert)."""
        self.install()
        try:
            yield self
        finally:
            self.uninstall()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        handlers = {WARNING_SIGNAL: self._on_warning, INTERRUPT_SIGNAL: self._on_interrupt}
        if self.submitit_handler is not None:
            handlers |= {REQUEUE_SIGNAL: self._on_requeue, TERMINATE_SIGNAL: self._on_terminate}
        self._previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}

    def uninstall(self) -> None:
        """The run is over: ignore the warning signals from now on, give INT and TERM back."""
        for sig, previous in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if sig in (WARNING_SIGNAL, REQUEUE_SIGNAL) else previous)
        self._previous = {}

    # --- handlers (flags only) ------------------------------------------------------------------

    def _on_warning(self, signum: int, frame: Any) -> None:
        _say(f"{signal.Signals(signum).name}: save requested")
        self._save_requested = True

    def _on_requeue(self, signum: int, frame: Any) -> None:
        if self.submitit_handler is not None and _requeues_left(self.submitit_handler) < 0:
            # stopping would end the run for good: better to keep going and maybe finish in time
            _say("requeue signal ignored: no requeue left (max_num_timeout)")
            return
        _say(f"{signal.Signals(signum).name}: requeue requested")
        self._save_requested = True
        self._requeue_asked = True

    def _on_terminate(self, signum: int, frame: Any) -> None:
        _say(f"{signal.Signals(signum).name}: Slurm is ending the job")
        self._terminating = True
        asked = self._requeue_asked or self._at_time_limit()
        owed = asked and not self._stop_for_requeue and not self.requeued_at_term
        if owed and self.submitit_handler is not None and self._resumable:
            _say(TERM_REQUEUE_SAID)
            self.requeued_at_term = True  # first: the requeue's own TERM re-enters this handler
            try:  # rank 0: ElementTask.checkpoint, `scontrol requeue`, then an exit; other ranks: it returns
                self.submitit_handler(REQUEUE_SIGNAL, None)
            except (SystemExit, Exception) as ending:  # raised after the save (hpcrl.launcher.element)
                self.term_requeue_ending = ending

    def checkpoints_and_resumes(self, time_left_s: float | None = None) -> None:
        """The entrypoint saves checkpoints and resumes from them (its stage checkpointing says so): a
        requeue on a TERM that beat the requested save continues the run instead of only restarting it.
        `time_left_s`: seconds to the job's time limit now (Slurm's, read once), so that the limit's TERM
        requeues even when no USR2 came (None: unknown or no limit)."""
        self._resumable = True
        if time_left_s is not None:
            self._limit_at = time.monotonic() + time_left_s

    def _at_time_limit(self) -> bool:
        return self._limit_at is not None and time.monotonic() >= self._limit_at - AT_LIMIT_SLACK_S

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        if self.interrupted_by is not None:
            raise KeyboardInterrupt
        self.interrupted_by = signum
        self._terminating = True
        _say(f"{signal.Signals(signum).name}: stopping after a save at the next step boundary (again: now)")

    # --- what the save trigger reads ------------------------------------------------------------

    def request_save(self) -> None:
        """Ask for a save-and-stop with a requeue at the next step boundary (what USR1/USR2 do)."""
        self._save_requested = True

    def take_save_request(self) -> bool:
        """Whether a save-and-stop was asked for since the last call (the request is consumed)."""
        requested, self._save_requested = self._save_requested, False
        return requested

    @property
    def terminating(self) -> bool:
        """The run must save and stop without a requeue of its own (TERM under Slurm, INT)."""
        return self._terminating

    # --- what the entrypoint reports ------------------------------------------------------------

    def stop_for_requeue(self) -> None:
        """The entrypoint saved and stopped early (warning signal or time limit): requeue the element."""
        self._stop_for_requeue = True

    def stop_for_termination(self) -> None:
        """The entrypoint saved and stopped because the job is ending: no requeue of our own."""
        self._stopped = True

    @property
    def wants_requeue(self) -> bool:
        return self._stop_for_requeue

    @property
    def stopped(self) -> bool:
        return self._stopped


def _say(text: str) -> None:
    print(f"hpcrl: {text}", file=sys.stderr, flush=True)


def _submitit_handler() -> Callable[..., Any] | None:
    """submitit's requeue handler when this process runs under submitit on Slurm, else None."""
    from submitit.core.job_environment import SignalHandler

    handler = signal.getsignal(REQUEUE_SIGNAL)
    return handler if isinstance(getattr(handler, "__self__", None), SignalHandler) else None


def requeues_left() -> int | None:
    """The requeues submitit has left for this process (< 0: it refuses the next one); None when submitit
    does not hold the requeue signal here (not under submitit, or hpcrl's handlers hold it)."""
    handler = _submitit_handler()
    return None if handler is None else _requeues_left(handler)


def _requeues_left(submitit_handler: Callable[..., Any]) -> int:
    """What submitit's handler would compute (its `max_num_timeout` countdown): < 0 = it will refuse to
    requeue. Reads submitit 1.5's private fields; unknown -> assume a requeue is possible."""
    handler = submitit_handler.__self__
    countdown = getattr(getattr(handler, "_delayed", None), "_timeout_countdown", None)
    return 0 if countdown is None else countdown - int(handler.has_timed_out())
