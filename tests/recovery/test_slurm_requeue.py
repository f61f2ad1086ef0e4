"""Recovery of the real tiny GRPO job on the dev Slurm cluster, through `hpcrl submit` (submitit arrays).

1. `--time=1` with ~3 minutes of work: Slurm's warning signal (submitit's USR2, every rank) -> save at
   the next step boundary -> requeue -> resume from `latest`, until done; the final state and every
   step's metrics equal a straight local run of the same config. The element takes ~5 minutes of wall
   time but little CPU (its steps sleep), so it runs in the BACKGROUND of the session: the session
   fixture `requeue_element` submits it (and starts the local reference run) the first time it is
   requested; tests/conftest.py moves the `background_start` test, which requests it, to the front of
   the session and the `background_check` test to the end. Run alone, the check simply waits.
2. `scontrol requeue` of a running 2-node element: Slurm's SIGTERM makes every rank save at the next step
   boundary and stop; Slurm restarts it, it resumes where it stopped (no logged step lost), and
   `hpcrl status` shows restart count 1.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcrl.cli import app as cli
from hpcrl.launcher.element import LAUNCHER_STATE, REQUEUED_WHILE_STARTING, load_resolved
from hpcrl.launcher.sweep_manifest import load_manifest
from hpcrl.lifecycle import TERM_REQUEUE_SAID
from hpcrl.stages.rank import STEP_SLEEP_ENV
from tests.recovery._runs import (
    REPO,
    TEMPLATES,
    digest,
    final_tensors,
    latest_step,
    metric_rows,
    run_dir_of,
    start_run,
    steps_logged,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "LOST"}
REQUEUABLE_ENDS = {"TIMEOUT", "PREEMPTED", "NODE_FAIL"}
"""Ends after which the job may run again; `hpcrl status` reports them only when the controller no longer
lists the job (a requeued one reads PENDING: hpcrl.launcher.slurm._requeued), so they are final here."""


def hpcrl(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "hpcrl", *args], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def submit(template: Path, tmp_path: Path) -> Path:
    sweep_dir = tmp_path / "sweep"
    name = f"{template.stem}-{uuid.uuid4().hex[:6]}"
    hpcrl(
        "submit",
        str(template),
        "--sweep_dir",
        str(sweep_dir),
        "--run_root",
        str(tmp_path / "runs"),
        "--name",
        name,
    )
    return sweep_dir


def element_status(sweep_dir: Path) -> dict:
    """`hpcrl status --json`, in this process: polled every 2 s for minutes, a fresh interpreter per poll
    cost ~0.5 s of CPU each (the table a user reads is checked through the command itself below)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["status", str(sweep_dir), "--json"]) == 0
    [element] = json.loads(out.getvalue())["elements"]
    return element


def is_final(element: dict) -> bool:
    """`hpcrl status` says TIMEOUT (or PREEMPTED, NODE_FAIL) only once the job has really ended: a
    requeued one reads as the controller's PENDING. Before, this waited on for the requeue count to reach
    max_requeues: a TIMEOUT that was never requeued kept it polling `hpcrl status` for 9 minutes."""
    return element["state"] in FINAL | REQUEUABLE_ENDS


def wait_final(sweep_dir: Path, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while not is_final(element := element_status(sweep_dir)) and time.monotonic() < deadline:
        time.sleep(2)
    return element


def slurm_log(sweep_dir: Path, rank: int = 0) -> str:
    """One rank's submitit stdout + stderr (Slurm appends across requeues)."""
    return "".join(p.read_text() for p in sorted((sweep_dir / "slurm").glob(f"*_{rank}_log.*")))


def assert_same_as_straight_run(run_dir: Path, ref_root: Path, steps: int) -> str:
    rows, expected = metric_rows(run_dir), metric_rows(run_dir_of(ref_root))
    assert [r["step"] for r in rows] == list(range(steps + 1))  # every step once (+ final evaluation)
    assert rows == expected  # bitwise, wall-clock metrics aside
    got, ref = final_tensors(run_dir / "checkpoints"), final_tensors(run_dir_of(ref_root) / "checkpoints")
    assert latest_step(run_dir / "checkpoints") == steps and digest(got) == digest(ref)
    return digest(got)


@dataclass(frozen=True)
class BackgroundRequeue:
    """The `--time=1` element submitted in the background of the session, and its straight local run."""

    sweep_dir: Path
    job_id: str
    reference_root: Path
    reference: subprocess.Popen
    submitted_at: float
    """time.time() at submission."""


REQUEUE_TEMPLATE = TEMPLATES / "grpo_requeue.yaml"
CHECK_WAIT_S = 540
"""How long the check waits for a final state (run alone, it waits for the whole element within pytest's
600 s timeout). Measured: 260-300 s from submission to COMPLETED, 5-6 attempts."""


@pytest.fixture(scope="session")
def requeue_element(slurm_cluster, tmp_path_factory) -> Iterator[BackgroundRequeue]:
    """Submit the `--time=1` element and start the straight local reference run, once per session; at the
    end of the session cancel whatever still runs (a session that never checked it)."""
    root = tmp_path_factory.mktemp("requeue")
    submitted_at = time.time()
    sweep_dir = submit(REQUEUE_TEMPLATE, root)
    # The reference needs no sleep (it changes no result): ~20 CPU-seconds beside the other tests.
    no_sleep = json.dumps({"OMP_NUM_THREADS": "1", STEP_SLEEP_ENV: "0"})
    reference = start_run(REQUEUE_TEMPLATE, root / "ref", "--cluster.env", no_sleep, log=root / "ref.log")
    job_id = load_manifest(sweep_dir).entries[0].job_id
    yield BackgroundRequeue(sweep_dir, job_id, root / "ref", reference, submitted_at)
    if reference.poll() is None:
        reference.kill()
        reference.wait()
    if not is_final(element_status(sweep_dir)):
        slurm_cluster.run(["scancel", job_id], check=False)


@pytest.mark.heavy
@pytest.mark.background_start
def test_one_minute_element_is_submitted_at_the_start_of_the_session(requeue_element):
    script = next((requeue_element.sweep_dir / "slurm").glob("*_submission.sh")).read_text()
    assert "#SBATCH --time=1\n" in script and "#SBATCH --signal=USR2@5\n" in script, script
    assert element_status(requeue_element.sweep_dir)["state"] in {"PENDING", "RUNNING"}
    assert requeue_element.reference.poll() in (None, 0)  # running or already done


@pytest.mark.heavy
@pytest.mark.background_check
def test_time_limit_of_one_minute_finishes_through_signal_save_and_requeue(requeue_element):
    run = requeue_element
    check_started = time.time()
    element = wait_final(run.sweep_dir, timeout_s=CHECK_WAIT_S)
    log = slurm_log(run.sweep_dir)
    assert element["state"] == "COMPLETED", log[-3000:]
    assert run.reference.wait(timeout=300) == 0  # ~30 s, started with the element (a guard)
    assert element["restarts"] >= 1
    stops = [
        int(line.split("step ")[1].split(":")[0])
        for line in log.splitlines()
        if "saved (requested), stopping for requeue" in line  # signal -> save -> stop, on each attempt
    ]
    saves = len(stops)
    # an attempt whose requested save had not landed when the time limit came is requeued at the TERM (by
    # hpcrl's handler: it saves after, within KillWait, if it can), or by submitit's own handler when
    # hpcrl's were not installed yet (a loaded node): "unsaved" counts those requeues
    unsaved = log.count(TERM_REQUEUE_SAID) + log.count(REQUEUED_WHILE_STARTING)
    requeues = element["restarts"]
    assert saves >= 1 and saves + unsaved == requeues, log[-3000:]
    # submitit logs "Requeued job" after `scontrol requeue` returns, and the requeue may TERM that scontrol
    # first (it runs inside the job: the clean-clone run of 7592ef8 logged 12 of 13 requeues)
    assert 1 <= log.count("Requeued job") <= requeues, log[-3000:]
    rank1_log = slurm_log(run.sweep_dir, rank=1)  # the signal reached the other rank too
    assert rank1_log.count("SIGUSR2: requeue requested") >= saves, rank1_log[-3000:]
    assert 1 <= log.count("resumed from") <= element["restarts"]  # one per attempt that got that far
    run_dir = Path(element["run_dir"])
    cfg = load_resolved(run_dir / "config.yaml")
    # more sleep alone than a one-minute attempt holds: no attempt can finish the run by itself
    assert cfg.cluster.time_min == 1 and cfg.algorithm.steps * float(cfg.cluster.env[STEP_SLEEP_ENV]) > 60
    final = assert_same_as_straight_run(run_dir, run.reference_root, steps=cfg.algorithm.steps)
    finished = json.loads((run_dir / LAUNCHER_STATE).read_text())["finished"]
    print(
        f"attempts={requeues + 1} requeues={requeues} ({unsaved} unsaved) stopped after steps {stops} "
        f"element wall={finished - run.submitted_at:.0f}s (submit -> COMPLETED), "
        f"check waited {time.time() - check_started:.0f}s, final state sha256={final}"
    )


@pytest.mark.heavy
def test_scontrol_requeue_of_a_running_two_node_element_resumes_it(slurm_cluster, tmp_path):
    template = TEMPLATES / "grpo_two_node.yaml"
    sweep_dir = submit(template, tmp_path)
    run_dir = Path(load_manifest(sweep_dir).entries[0].run_dir)
    job_id = load_manifest(sweep_dir).entries[0].job_id

    def checkpoint_and_steps_after_it() -> int | None:  # running, with a checkpoint and steps done after it
        ckpt = latest_step(run_dir / "checkpoints") if (run_dir / "checkpoints").exists() else None
        return ckpt if ckpt and steps_logged(run_dir) > ckpt else None

    wait_until(checkpoint_and_steps_after_it, 300, "a checkpoint and a step after it", poll_s=0.5)
    logged_before = steps_logged(run_dir)
    slurm_cluster.run(["scontrol", "requeue", job_id])
    reference = start_run(template, tmp_path / "ref", log=tmp_path / "ref.log")  # 2 local ranks
    element = wait_final(sweep_dir, timeout_s=300)  # a guard: two attempts of ~35 s, pending time included
    log = slurm_log(sweep_dir)
    assert element["state"] == "COMPLETED", log[-3000:]
    assert element["restarts"] == 1
    assert "restarts" in (out := hpcrl("status", str(sweep_dir))) and "│ 1 " in out.split("restarts")[1], out
    resumed_at = int(log.split("resumed from")[1].split("at step ")[1].split()[0])
    # Slurm's SIGTERM (KillWait=5 s before SIGKILL) reached both ranks; they saved at the next step
    # boundary and stopped without a requeue of their own: the restart lost no step that was logged
    assert "SIGTERM: Slurm is ending the job" in slurm_log(sweep_dir, rank=1), slurm_log(sweep_dir, 1)[-3000:]
    assert "stopping: the job is ending" in log, log[-3000:]
    assert logged_before <= resumed_at < 20, (logged_before, resumed_at)
    assert reference.wait(timeout=300) == 0
    final = assert_same_as_straight_run(run_dir, tmp_path / "ref", steps=20)
    print(f"requeued after {logged_before} logged steps, resumed at {resumed_at}, final sha256={final}")


@pytest.mark.heavy
def test_the_time_limit_before_the_requested_save_requeues_at_once_and_still_saves(slurm_cluster, tmp_path):
    """USR2 (submitit's time-limit warning) during a step that cannot end before the TERM that follows:
    the element is requeued at once, the step still ends within KillWait (15 s here; the requeue's own
    TERM starts it again), both ranks save step 2 at its boundary, and the next attempt resumes from that
    save. Before: first TERM only stopped it, nobody requeued, and the element ended as TIMEOUT (what a
    loaded CI node did to the one-minute element); then submitit's exit inside the TERM handler requeued
    it unsaved, and the next attempt redid the step from the checkpoint before the signals."""
    sweep_dir = submit(TEMPLATES / "grpo_signalled.yaml", tmp_path)
    [entry] = load_manifest(sweep_dir).entries
    run_dir = Path(entry.run_dir)
    wait_until(lambda: latest_step(run_dir / "checkpoints") == 1, 300, "step 1's checkpoint", poll_s=0.5)
    # step 1 now sleeps 10 s: no step boundary comes between the two signals
    slurm_cluster.run(["scancel", "--signal=USR2", entry.job_id])
    for rank in (0, 1):  # in order: TERM only after every rank took the warning
        warned = lambda rank=rank: "USR2: requeue requested" in slurm_log(sweep_dir, rank)  # noqa: E731
        wait_until(warned, 60, f"rank {rank} to take the USR2")
    slurm_cluster.run(["scancel", "--signal=TERM", entry.job_id])
    element = wait_final(sweep_dir, timeout_s=300)  # a guard: a requeue and a 1-step attempt
    log = slurm_log(sweep_dir)
    assert element["state"] == "COMPLETED" and element["restarts"] == 1, log[-3000:]
    assert TERM_REQUEUE_SAID in log and "saved (requested)," not in log, log[-3000:]
    assert "step 2: saved (periodic, requested, terminating), stopping: the job is ending" in log, log[-3000:]
    assert "step_00000002 at step 2" in log, log[-3000:]  # resumed from the save after the TERM
    assert [r["step"] for r in metric_rows(run_dir)] == [0, 1, 2]  # each step once
