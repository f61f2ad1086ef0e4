"""The workload of the crash-consistency tests: a job that resumes as the RL job does (the newest
checkpoint that verifies, damaged ones set aside) and then saves every step, until it is killed
(`run_until_killed`, reporting each step it knows is committed on a pipe) or up to a step (`rerun`)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.load import NoCheckpoint
from hpcrl.ckpt.shards import ShardedTensor
from hpcrl.ckpt.state import RunState

NUM_FLOATS = 1 << 19  # 2 MiB
NUM_INTS = 1 << 17  # 1 MiB


def content(step: int) -> dict[str, torch.Tensor]:
    """The state after `step` steps: every value is a function of the step (cheap, exact)."""
    return {
        "w": torch.full((NUM_FLOATS,), float(step)),
        "idx": torch.arange(NUM_INTS, dtype=torch.int64) + step,
    }


def specs():
    return [ShardedTensor.whole(n, t).spec for n, t in content(0).items()]


def resume(ck: Checkpointer) -> int:
    """The step the newest checkpoint that verifies holds (0: none committed), checked to hold exactly
    that step's state; damaged newer ones are set aside (`Checkpointer.load` with fallback)."""
    try:
        loaded = ck.load(specs(), fallback=True)
    except NoCheckpoint:
        return 0
    for name, expected in content(loaded.state.step).items():
        assert torch.equal(loaded.tensors[name], expected), f"{loaded.path}: {name}"
    return loaded.state.step


def rerun(root: Path, until: int) -> int:
    """One (re)run of the job: resume, then a sync save of every step up to `until`. Returns the step
    it resumed at."""
    ck = Checkpointer(root, keep_last=2, async_save=False)
    start = resume(ck)
    for step in range(start + 1, until + 1):
        ck.save(step, [ShardedTensor.whole(n, t) for n, t in content(step).items()], RunState(step=step))
    ck.close()
    return start


def run_until_killed(root: Path, async_save: bool, report_fd: int) -> None:
    ck = Checkpointer(root, keep_last=2, async_save=async_save)
    start = resume(ck) + 1
    live = content(0)
    for step in itertools.count(start):
        ck.fence()  # the previous async save's snapshot is taken: the tensors may change now
        for name, tensor in content(step).items():
            live[name].copy_(tensor)  # in place, like an optimizer step
        ck.save(step, [ShardedTensor.whole(n, t) for n, t in live.items()], RunState(step=step))
        # sync: `step` is committed once save returns; async: save waited for the previous one
        committed = step if not async_save else step - 1
        if committed >= start:
            os.write(report_fd, f"{committed}\n".encode())


def kill_trial(root: Path, async_save: bool, delay_s: float) -> dict:
    """Fork a `run_until_killed` child, SIGKILL it after `delay_s`, return what it promised."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        os.close(read_fd)
        try:
            run_until_killed(root, async_save, write_fd)
        finally:
            os._exit(1)
    os.close(write_fd)
    time.sleep(delay_s)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_fd) as pipe:
        reported = [int(line) for line in pipe.read().split()]
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return {"promised": reported[-1] if reported else None, "killed": killed}


def zygote() -> None:
    """Fork server for the crash test: this fresh process has torch imported but never ran a parallel
    torch op, so its forked children do not inherit a dead OpenMP pool (forking the pytest process
    itself deadlocks the child in its first torch op). Reads 'root async delay' lines, answers JSON."""
    for line in sys.stdin:
        root, async_save, delay = line.split()
        print(json.dumps(kill_trial(Path(root), async_save == "1", float(delay))), flush=True)


if __name__ == "__main__":
    zygote()
