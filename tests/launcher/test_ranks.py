"""The ranks of a local `hpcrl run` are supervised as one job (hpcrl.launcher.ranks): Ctrl-C reaches
every rank and none outlives the launcher (not even a SIGKILLed one); a dead rank is named, with its
host and signal, and the exit code says "a rank died"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcrl.launcher.ranks import RANK_DIED_EXIT, RankEnd
from hpcrl.stages.rank import STEP_SLEEP_ENV
from tests.processes import alive

REPO = Path(__file__).resolve().parents[2]
TWO_RANKS = ("--parallel.data", "2", "--cluster.tasks_per_node", "2", "--cluster.stop_grace_s", "8")


def _start(template: Path, run_root: Path, env: dict[str, str], log: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hpcrl", "run", str(template), "--run_root", str(run_root), *TWO_RANKS]
    cmd += ["--cluster.env", json.dumps({"OMP_NUM_THREADS": "1", **env}), *extra]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def _grpo(tmp_path: Path) -> subprocess.Popen:
    """The real RL job on 2 ranks, slowed down by the step-sleep knob (no CPU cost)."""
    quiet = ("--logging.tensorboard", "false", "--logging.progress", "false", "--logging.plot", "false")
    return _start(
        REPO / "templates" / "grpo_tiny.yaml",
        tmp_path / "runs",
        {STEP_SLEEP_ENV: "0.5"},
        tmp_path / "run.log",
        "--algorithm.steps",
        "100000",  # never ends on its own: only the stop under test ends it, however long the guards
        "--algorithm.eval_every",
        "0",
        *quiet,
    )


def _probe(tmp_path: Path) -> subprocess.Popen:
    """The probe entrypoint on 2 ranks, waiting after its collectives for a file that never appears (it
    never stops on its own)."""
    template = tmp_path / "probe.yaml"
    template.write_text("entrypoint: hpcrl.launcher.probe:main\nname: probe\n")
    gate = {"HPCRL_PROBE_WAIT_FOR": str(tmp_path / "never")}
    return _start(template, tmp_path / "runs", gate, tmp_path / "run.log")


def _children(pid: int) -> list[int]:
    try:
        return sorted(int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    except FileNotFoundError:
        return []


def _ranks_of(launcher: subprocess.Popen) -> list[int]:
    """The launcher's ranks, rank 0 first: the children of its one child, the element's rank server."""
    return [rank for server in _children(launcher.pid) for rank in _children(server)]


def _wait_for(condition, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {log.read_text()[-3000:]}"
        time.sleep(0.05)


def _running_with_two_ranks(launcher: subprocess.Popen, tmp_path: Path, logged_a_step: bool) -> list[int]:
    """Wait until both ranks run (rank 0 wrote launcher.json after the group formed, and with
    `logged_a_step` the job logged a metrics row); returns the ranks' pids."""
    log = tmp_path / "run.log"

    def ready() -> bool:
        assert launcher.poll() is None, log.read_text()[-3000:]
        states = list((tmp_path / "runs").glob("*/*/launcher.json"))
        if not states or json.loads(states[0].read_text()).get("state") != "RUNNING":
            return False
        metrics = states[0].parent / "metrics.jsonl"
        return not logged_a_step or (metrics.exists() and metrics.read_text().count("\n") >= 1)

    _wait_for(ready, 300, "two running ranks", log)
    pids = _ranks_of(launcher)
    assert len(pids) == 2, pids
    return pids


def _all_gone(pids: list[int], timeout_s: float, log: Path) -> None:
    _wait_for(lambda: not any(alive(pid) for pid in pids), timeout_s, f"ranks {pids} to end", log)


def test_a_rank_end_names_the_rank_its_host_and_how_it_ended():
    assert RankEnd(1, 2, 42, "node7", -signal.SIGKILL).describe() == (
        "rank 1 of 2 (pid 42, host node7) was killed by SIGKILL"
    )
    assert RankEnd(0, 2, 41, "node7", 1, "RuntimeError: boom").describe() == (
        "rank 0 of 2 (pid 41, host node7) exited with code 1: RuntimeError: boom"
    )


@pytest.mark.heavy
@pytest.mark.slow
def test_ctrl_c_of_hpcrl_run_stops_both_ranks(tmp_path):
    launcher = _grpo(tmp_path)
    pids = _running_with_two_ranks(launcher, tmp_path, logged_a_step=True)
    launcher.send_signal(signal.SIGINT)
    _all_gone(pids, 120, tmp_path / "run.log")
    assert launcher.wait(timeout=120) == 128 + signal.SIGINT
    log = (tmp_path / "run.log").read_text()
    assert "hpcrl: SIGINT: stopping the ranks" in log


@pytest.mark.heavy
@pytest.mark.slow
def test_sigkill_of_rank_0_is_reported_as_that_rank_and_the_exit_code_says_a_rank_died(tmp_path):
    """Before: exit code 247 (-9 of rank 0 passed on as is) and only rank 1's gloo 'Connection reset by
    peer' on the terminal."""
    launcher = _grpo(tmp_path)
    pids = _running_with_two_ranks(launcher, tmp_path, logged_a_step=True)
    os.kill(pids[0], signal.SIGKILL)
    assert launcher.wait(timeout=120) == RANK_DIED_EXIT
    _all_gone(pids, 120, tmp_path / "run.log")
    reports = [line for line in (tmp_path / "run.log").read_text().splitlines() if line.startswith("hpcrl: ")]
    died = [line for line in reports if "rank " in line and " of 2 (pid " in line]
    assert died[0].startswith(f"hpcrl: rank 0 of 2 (pid {pids[0]}, host ") and died[0].endswith("SIGKILL"), (
        reports
    )


@pytest.mark.heavy
def test_sigkill_of_the_launcher_takes_its_ranks_with_it(tmp_path):
    launcher = _probe(tmp_path)
    pids = _running_with_two_ranks(launcher, tmp_path, logged_a_step=False)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=120)
    _all_gone(pids, 120, tmp_path / "run.log")


@pytest.mark.heavy
def test_a_sigkilled_rank_0_does_not_leave_launcher_json_saying_running(tmp_path):
    """Rank 0 writes RUNNING once the group formed and its own end when it can; SIGKILLed it cannot, and
    launcher.json said RUNNING for good. The launcher that saw it die records how."""
    launcher = _probe(tmp_path)
    pids = _running_with_two_ranks(launcher, tmp_path, logged_a_step=False)
    os.kill(pids[0], signal.SIGKILL)
    assert launcher.wait(timeout=120) == RANK_DIED_EXIT
    [state_file] = (tmp_path / "runs").glob("*/*/launcher.json")
    state = json.loads(state_file.read_text())
    assert state["state"] == "FAILED", state
    assert state["error"].startswith(f"rank 0 of 2 (pid {pids[0]}, host ") and state["error"].endswith(
        "SIGKILL"
    )
