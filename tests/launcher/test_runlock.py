"""One writer per run (hpcrl.launcher.runlock): a second writer of a run directory is refused at once,
naming the holder's host and pid; the kernel frees the lock of a holder that dies."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcrl.launcher.runlock import LOCK_FILE, LockTarget, RunLocked, lock_targets, writer_lock
from hpcrl.stages.rank import STEP_SLEEP_ENV

REPO = Path(__file__).resolve().parents[2]


def test_a_second_writer_is_refused_naming_the_holder_and_may_lock_once_it_is_released(tmp_path):
    targets = [LockTarget(tmp_path / "run", "run_dir")]
    holder = f"pid {os.getpid()} on host {socket.gethostname()}"
    with writer_lock(targets), pytest.raises(RunLocked, match=holder) as err, writer_lock(targets):
        pass
    assert str(err.value).startswith(f"run_dir: {tmp_path / 'run'} is in use by another writer")
    with writer_lock(targets):  # released with the block
        pass


def test_the_checkpoint_root_is_locked_too_when_it_is_outside_the_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    assert [t.key for t in lock_targets(run_dir, None)] == ["run_dir"]
    assert [t.key for t in lock_targets(run_dir, str(run_dir / "ckpt"))] == ["run_dir"]
    assert [t.key for t in lock_targets(run_dir, str(tmp_path / "shared"))] == ["run_dir", "checkpoint.dir"]
    with writer_lock(lock_targets(tmp_path / "a", str(tmp_path / "shared"))):
        with (
            pytest.raises(RunLocked, match="checkpoint.dir: .*shared is in use"),
            writer_lock(lock_targets(tmp_path / "b", str(tmp_path / "shared"))),
        ):
            pass
        assert (tmp_path / "b" / LOCK_FILE).exists() and _unlocked(tmp_path / "b")  # all or none


def _unlocked(directory: Path) -> bool:
    try:
        with writer_lock([LockTarget(directory, "run_dir")]):
            return True
    except RunLocked:
        return False


def test_the_lock_of_a_killed_holder_is_free_at_once(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from hpcrl.launcher.runlock import LockTarget, "
            "writer_lock\nwith writer_lock([LockTarget(Path(sys.argv[1]), 'run_dir')]):\n"
            "    print('locked', flush=True); time.sleep(600)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"  # waits on the condition
    assert not _unlocked(tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=120)
    assert _unlocked(tmp_path)


def _start(run_root: Path, log: Path) -> subprocess.Popen:
    env = json.dumps({"OMP_NUM_THREADS": "1", STEP_SLEEP_ENV: "0.5"})
    cmd = [sys.executable, "-m", "hpcrl", "run", str(REPO / "templates" / "grpo_tiny.yaml")]
    cmd += ["--run_root", str(run_root), "--algorithm.steps", "30", "--algorithm.eval_every", "0"]
    cmd += ["--logging.tensorboard", "false", "--logging.progress", "false", "--logging.plot", "false"]
    cmd += ["--cluster.env", env]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.heavy
@pytest.mark.slow
def test_a_second_hpcrl_run_on_the_same_run_dir_exits_2_at_once_and_the_first_is_untouched(tmp_path):
    runs = tmp_path / "runs"
    first = _start(runs, tmp_path / "first.log")
    metrics = lambda: list(runs.glob("*/*/metrics.jsonl"))  # noqa: E731
    _wait_for(
        lambda: metrics() and metrics()[0].read_text().count("\n") >= 1 or first.poll() is not None,
        300,
        "a metrics row",
    )
    # frozen while it holds the lock (one process: `hpcrl run` of one rank runs it in-process), the first
    # cannot finish or release it, so a refusal that comes back meanwhile did not wait for the lock
    first.send_signal(signal.SIGSTOP)
    try:
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        run_dir = metrics()[0].parent
        second = _start(runs, tmp_path / "second.log")
        assert second.wait(timeout=120) == 2  # a guard: waiting for the lock would hang here
        second_log = (tmp_path / "second.log").read_text()
        assert (
            f"run_dir: {run_dir} is in use by another writer: pid {first.pid} on host {socket.gethostname()}"
            in second_log
        )
        assert json.loads((run_dir / "launcher.json").read_text())["state"] == "RUNNING"  # not the second's
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(30))  # every step once: no row of the second writer
