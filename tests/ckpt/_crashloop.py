"""The workload of the crash-consistency tests: a job that resumes as the RL job does (the newest
checkpoint that verifies, damaged ones set aside) and then saves every step, until it is killed
(`run_until_killed`, reporting each step it knows is committed on a pipe) or up to a step (`rerun`).

Where it is killed is chosen, not left to the clock: `kill_trial` names a pause point of the save
protocol (`PAUSE_POINTS`) and the how-many-th call of it; the child freezes itself there (SIGSTOP, every
thread at once, after reporting the root's listing at that moment) and the parent SIGKILLs it. Every kill
therefore lands inside a save on any machine, however busy, and `inside_save` checks the listing shows it.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import select
import signal
import sys
from collections.abc import Callable
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


PAUSE_POINTS: dict[str, tuple[str, str]] = {
    # label: (module, function) called at that moment of a save (looked up at call time, so patchable)
    "rank file begun": ("hpcrl.ckpt.save", "write_rank_file"),
    "rank file half written": ("hpcrl.ckpt.rankfile", "_pwrite_all"),
    "rank file not yet fsynced": ("hpcrl.ckpt.rankfile", "fsync_file"),
    "rank record": ("hpcrl.ckpt.save", "write_last"),
    "manifest written": ("hpcrl.ckpt.save", "fsync_dir"),
    "commit rename": ("hpcrl.ckpt.save", "commit"),
    "renamed, latest not moved": ("hpcrl.ckpt.commit", "publish"),
    "latest moved, not verified": ("hpcrl.ckpt.save", "check_committed"),
    "pruning old checkpoints": ("hpcrl.ckpt.commit", "_delete_all"),
}
"""The moments of one save (hpcrl.ckpt.save's sequence, commit.py's protocol) a trial can be killed at."""

_TMP_POINTS = {"rank file begun", "rank file half written", "rank file not yet fsynced", "rank record"}
_TMP_POINTS |= {"manifest written", "commit rename"}


def inside_save(
    label: str, listing: list[str], latest: str | None, deleting: list[str] | None = None
) -> bool:
    """Whether the root's `listing` (and `latest`'s text) at a pause at `label` shows a save in progress:
    its tmp dir before the commit rename, a committed dir newer than `latest` before `latest` moves, the
    new `latest` before verification. Pruning is told by what the paused call deletes (`deleting`): a sync
    save prunes in a thread of its own, and the next save's `remove_leftovers` may already have removed
    that trash from the listing by the time the thread reaches the pause (a run on a busy machine)."""
    steps = [int(name[5:]) for name in listing if name.startswith("step_") and name[5:].isdigit()]
    latest_step = int(latest[5:]) if latest else None
    if label in _TMP_POINTS:
        return any(".tmp-" in name for name in listing)
    if label == "renamed, latest not moved":
        return bool(steps) and (latest_step is None or max(steps) > latest_step)
    if label == "latest moved, not verified":
        return bool(steps) and latest_step == max(steps)
    return bool(deleting) and all(".trash-" in name or ".rejected-" in name for name in deleting)


def _counts_as_call(label: str, args: tuple) -> bool:
    """Calls that do something at that point (an empty prune list deletes nothing)."""
    return label != "pruning old checkpoints" or bool(args[0])


def _install_pause(root: Path, label: str, occurrence: int, report_fd: int) -> None:
    """Make the `occurrence`-th call of `label`'s function freeze this process before it runs: report
    the root's listing and `latest`, then SIGSTOP (all threads stop at once; the parent kills)."""
    module_name, attr = PAUSE_POINTS[label]
    module = importlib.import_module(module_name)
    original: Callable = getattr(module, attr)
    calls = itertools.count(1)

    def paused(*args, **kwargs):
        if _counts_as_call(label, args) and next(calls) == occurrence:
            latest = root / "latest"
            report = {
                "paused": label,
                "listing": sorted(os.listdir(root)),
                "latest": latest.read_text().strip() if latest.is_file() else None,
            }
            if label == "pruning old checkpoints":  # what this call deletes: `inside_save`
                report["deleting"] = [Path(path).name for path in args[0]]
            os.write(report_fd, (json.dumps(report) + "\n").encode())
            os.kill(os.getpid(), signal.SIGSTOP)
        return original(*args, **kwargs)

    setattr(module, attr, paused)


def kill_trial(root: Path, async_save: bool, label: str, occurrence: int, guard_s: float = 300.0) -> dict:
    """Fork a `run_until_killed` child paused at the `occurrence`-th call of `label`, SIGKILL it there,
    return what it promised and what the root held at the kill. `guard_s` only guards against a hang."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        os.close(read_fd)
        try:
            _install_pause(root, label, occurrence, write_fd)
            run_until_killed(root, async_save, write_fd)
        finally:
            os._exit(1)
    os.close(write_fd)
    reported, pause, buffer = [], None, b""
    while pause is None and select.select([read_fd], [], [], guard_s)[0]:
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:  # the child exited without pausing
            break
        *lines, buffer = (buffer + chunk).split(b"\n")
        for line in lines:
            if line.startswith(b"{"):
                pause = json.loads(line)
            else:
                reported.append(int(line))
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(read_fd)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return {"promised": reported[-1] if reported else None, "killed": killed, "pause": pause}


def zygote() -> None:
    """Fork server for the crash test: this fresh process has torch imported but never ran a parallel
    torch op, so its forked children do not inherit a dead OpenMP pool (forking the pytest process
    itself deadlocks the child in its first torch op). Reads JSON lines {root, async_save, label,
    occurrence}, answers JSON."""
    for line in sys.stdin:
        ask = json.loads(line)
        result = kill_trial(Path(ask["root"]), ask["async_save"], ask["label"], ask["occurrence"])
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    zygote()
