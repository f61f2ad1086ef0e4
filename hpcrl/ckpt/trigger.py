"""When to checkpoint: every N steps, on a Slurm warning signal, and before the time limit.

Signals are not handled here: the run's lifecycle (hpcrl.lifecycle.Lifecycle, the one owner
of the process's signal handlers) keeps them as flags, and the trigger reads them through `signals`
(any object with `take_save_request()` and `terminating`). At each step boundary
`SaveTrigger.decide(step, group)` turns the local reasons into one decision that every rank shares (a
4-element MAX all-reduce), because ranks receive signals at slightly different moments:

    periodic    every_steps > 0 and step % every_steps == 0
    requested   a warning signal (sbatch `--signal=B:USR1@90`, submitit's USR2 on every rank) or
                `request()` since the last decision
    terminating `terminate()` or the lifecycle's SIGTERM (Slurm is ending the job: preemption, `scontrol
                requeue`, scancel; it kills it KillWait later) or SIGINT (Ctrl-C of a local run)
    deadline    time left < safety · (slowest step + slowest save), time left measured from Slurm once
                at start (`squeue -h -j $SLURM_JOB_ID -o %L`) and counted down locally
    -> save = any of them; stop = requested, deadline or terminating; requeue = stop unless terminating
       (the caller saves, then exits: for its own requeue, or leaving the job's fate to Slurm).
On restart the run resumes from `latest`; the restart count is SLURM_RESTART_COUNT.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from hpcrl.distributed.collectives import collective_device

_DURATION = re.compile(r"^(?:(?:(\d+)-)?(\d+):)?(\d+):(\d+)$")


def parse_slurm_duration(text: str) -> float | None:
    """Slurm's time format ('[days-]hours:minutes:seconds', 'minutes:seconds') in seconds; None for
    UNLIMITED / NOT_SET / INVALID."""
    text = text.strip()
    match = _DURATION.match(text)
    if not match:
        if text.upper() in ("UNLIMITED", "NOT_SET", "INVALID", ""):
            return None
        raise ValueError(f"not a Slurm duration: {text!r}")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def slurm_time_left(job_id: str | None = None, timeout_s: float = 10.0) -> float | None:
    """Seconds until this Slurm job's time limit (None outside Slurm or without a limit)."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%L"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.split()
    return parse_slurm_duration(lines[0]) if lines else None


def restart_count() -> int:
    """How often Slurm restarted this job (requeue, node failure)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


class StopSignals(Protocol):
    """What the trigger reads from the run's lifecycle (hpcrl.lifecycle.Lifecycle)."""

    def take_save_request(self) -> bool: ...

    @property
    def terminating(self) -> bool: ...


@dataclass(frozen=True)
class SaveDecision:
    save: bool
    stop: bool
    reasons: tuple[str, ...]
    requeue: bool = False
    """Stop AND ask for a requeue (requested / deadline). A terminating job is not requeued by us:
    Slurm requeues a preempted or `scontrol requeue`d job itself and a cancelled one must stay ended."""


class SaveTrigger:
    """One per rank; see the module docstring. `time_left_s` is read once, at construction."""

    def __init__(
        self,
        every_steps: int,
        *,
        time_left_s: float | None = None,
        safety: float = 1.5,
        clock: Callable[[], float] = time.monotonic,
        signals: StopSignals | None = None,
    ) -> None:
        self.every_steps = every_steps
        self.signals = signals
        self.safety = safety
        self._clock = clock
        self._deadline = None if time_left_s is None else clock() + time_left_s
        self._requested = False
        self._terminating = False
        self._slowest_step_s = 0.0
        self._slowest_save_s = 0.0

    @classmethod
    def from_slurm(cls, every_steps: int, **kwargs) -> SaveTrigger:
        return cls(every_steps, time_left_s=slurm_time_left(), **kwargs)

    def request(self) -> None:
        """Ask for a save-and-stop at the next step boundary."""
        self._requested = True

    def terminate(self) -> None:
        """The job is ending: save and stop at the next step boundary, without a requeue of our own."""
        self._terminating = True

    def record_step(self, seconds: float) -> None:
        self._slowest_step_s = max(self._slowest_step_s, seconds)

    def record_save(self, seconds: float) -> None:
        self._slowest_save_s = max(self._slowest_save_s, seconds)

    def time_left(self) -> float | None:
        return None if self._deadline is None else self._deadline - self._clock()

    def decide(self, step: int, group: dist.ProcessGroup | None) -> SaveDecision:
        """Collective over `group` (None: this process alone): the same decision on every rank."""
        left = self.time_left()
        signalled = self.signals is not None and self.signals.take_save_request()
        local = [
            self.every_steps > 0 and step % self.every_steps == 0,
            self._requested or signalled,
            self.safety > 0
            and left is not None
            and left < self.safety * (self._slowest_step_s + self._slowest_save_s),
            self._terminating or (self.signals is not None and self.signals.terminating),
        ]
        self._requested = False
        flags = torch.tensor([int(f) for f in local], dtype=torch.int64, device=collective_device(group))
        if group is not None:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
        flags = flags.cpu()
        _, requested, deadline, terminating = (bool(f) for f in flags.tolist())
        names = ("periodic", "requested", "deadline", "terminating")
        reasons = tuple(n for n, f in zip(names, flags.tolist(), strict=True) if f)
        stop = requested or deadline or terminating
        return SaveDecision(save=bool(reasons), stop=stop, reasons=reasons, requeue=stop and not terminating)
