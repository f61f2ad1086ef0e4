"""User code can be stopped (issue 43, item 2): hpcrl.usercode.runner runs a function in a worker of its
own session, reused across calls; one that sleeps forever, forks a child that sleeps, prints 100 MB or
allocates until it dies is stopped, every process it started gone (checked by PID, in /proc), and the
next call gets a fresh worker. Real processes throughout; no sleeps in the tests (the functions sleep)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcrl.usercode.runner import (
    UserCodeDied,
    UserCodeImportFailed,
    UserCodeRaised,
    UserCodeRunner,
    UserCodeTimeout,
)
from tests.waiting import wait_until

FUNCTIONS = """\
import os, sys, time

def echo(x, pids):
    return {"x": x, "pid": os.getpid()}

def sleep_forever(x, pids):
    open(pids, "w").write(str(os.getpid()))
    time.sleep(3600)

def fork_and_sleep(x, pids):
    child = os.fork()
    if child == 0:
        time.sleep(3600)
        os._exit(0)
    open(pids, "w").write(f"{os.getpid()} {child}")
    time.sleep(3600)

def fork_and_return(x, pids):
    child = os.fork()
    if child == 0:
        time.sleep(3600)
        os._exit(0)
    open(pids, "w").write(f"{os.getpid()} {child}")
    return x

def print_100_mb(x, pids):
    line = "y" * 1023 + "\\n"
    for _ in range(100 * 1024):
        sys.stdout.write(line)
    sys.stdout.flush()
    return x

def allocate_until_dead(x, pids):
    open(pids, "w").write(str(os.getpid()))
    hoard = []
    while True:
        hoard.append(bytearray(16 << 20))

def raise_error(x, pids):
    raise KeyError("boom")

def exit_hard(x, pids):
    os._exit(3)
"""


@pytest.fixture()
def code(tmp_path: Path) -> Path:
    path = tmp_path / "functions.py"
    path.write_text(FUNCTIONS)
    return path


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by whoever adopted it, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


def _runner(code: Path, name: str, timeout_s: float = 120, **kwargs) -> UserCodeRunner:
    return UserCodeRunner(f"{code}:{name}", timeout_s=timeout_s, **kwargs)


def test_a_worker_is_reused_across_calls_and_gone_after_close(code, tmp_path):
    with _runner(code, "echo") as runner:
        first = runner.call(1, "")
        second = runner.call([1, "a", None], "")
        assert first == {"x": 1, "pid": runner.pid} and second["pid"] == runner.pid
        assert second["x"] == [1, "a", None] and runner.pid != os.getpid()
        pid = runner.pid
    assert runner.pid is None and not _alive(pid)


@pytest.mark.parametrize("name", ["sleep_forever", "fork_and_sleep"])
def test_a_call_past_its_timeout_is_killed_with_every_process_it_started(code, tmp_path, name):
    pids = tmp_path / "pids"
    with _runner(code, name, timeout_s=2) as runner:
        with pytest.raises(UserCodeTimeout, match="did not return within 2 s: its processes were killed"):
            runner.call(0, str(pids))
        started = _pids(pids)
        assert len(started) == (2 if name == "fork_and_sleep" else 1)
        wait_until(lambda: not any(map(_alive, started)), 30, f"{started} to be gone")
        assert runner.pid is None  # the next call starts a fresh worker


def test_close_kills_a_child_the_function_left_running(code, tmp_path):
    pids = tmp_path / "pids"
    runner = _runner(code, "fork_and_return")
    assert runner.call(7, str(pids)) == 7
    worker, child = _pids(pids)
    assert _alive(child)
    runner.close()
    wait_until(lambda: not _alive(worker) and not _alive(child), 30, "the worker and its child to be gone")


def test_100_mb_of_output_is_drained_and_capped(code, capsys):
    with _runner(code, "print_100_mb", output_bytes=64 << 10) as runner:
        assert runner.call(5, "") == 5
        worker = runner._worker
        wait_until(lambda: worker.output_total >= 100 << 20, 60, "the worker's output drained")
        assert len(worker.output) == 64 << 10  # the tail, not 100 MB
    err = capsys.readouterr().err
    assert "print_100_mb] output (" in err and len(err) < 16 << 10


def test_a_function_that_allocates_until_it_dies_is_stopped_and_replaced(code, tmp_path):
    pids = tmp_path / "pids"
    with _runner(code, "allocate_until_dead", timeout_s=60, memory_bytes=512 << 20) as runner:
        with pytest.raises((UserCodeRaised, UserCodeDied)) as err:
            runner.call(0, str(pids))
        assert "MemoryError" in str(err.value) or "killed by" in str(err.value)
        [pid] = _pids(pids)
        if isinstance(err.value, UserCodeDied):
            wait_until(lambda: not _alive(pid), 30, "the worker to be gone")
    wait_until(lambda: not _alive(pid), 30, "the worker to be gone after close")


def test_an_exception_and_a_hard_exit_are_reported_and_the_next_call_works(code):
    with _runner(code, "raise_error") as runner:
        with pytest.raises(UserCodeRaised, match="KeyError: 'boom'") as err:
            runner.call(0, "")
        assert err.value.type_name == "KeyError" and "raise KeyError" in str(err.value)
        pid = runner.pid
        with pytest.raises(UserCodeRaised):
            runner.call(0, "")
        assert runner.pid == pid  # a raise leaves the worker usable
    with _runner(code, "exit_hard") as runner, pytest.raises(UserCodeDied, match="exit code 3"):
        runner.call(0, "")


def test_a_worker_killed_from_outside_is_replaced(code):
    with _runner(code, "echo") as runner:
        first = runner.call(0, "")["pid"]
        os.kill(first, 9)
        wait_until(lambda: not runner.alive, 30, "the worker to be reapable")
        second = runner.call(0, "")["pid"]
        assert second != first and _alive(second)


def test_a_function_that_cannot_be_imported_is_reported_with_its_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import no_such_module_hpcrl\ndef f(x):\n    return x\n")
    with pytest.raises(UserCodeImportFailed, match="failed to import: ModuleNotFoundError"):
        UserCodeRunner(f"{bad}:f", timeout_s=5).call(0)
