"""Recovery of the real tiny GRPO job on the dev Slurm cluster, through `hpcrl submit` (submitit arrays).

1. `--time=1` with more work than one attempt holds: Slurm's warning signal (submitit's USR2, every rank)
   -> save at the next step boundary -> requeue -> resume from `latest`, until done; the final state
   and every step's metrics equal a straight local run of the same config.
2. `scontrol requeue` of a running 2-node element: it restarts, resumes from its latest periodic
   checkpoint, and `hpcrl status` shows restart count 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hpcrl.launcher.manifest import load_manifest
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

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


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
    [element] = json.loads(hpcrl("status", str(sweep_dir), "--json"))["elements"]
    return element


def wait_final(sweep_dir: Path, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while (element := element_status(sweep_dir))["state"] not in FINAL and time.monotonic() < deadline:
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


def test_time_limit_of_one_minute_finishes_through_signal_save_and_requeue(slurm_cluster, tmp_path):
    template = TEMPLATES / "grpo_requeue.yaml"
    started = time.monotonic()
    sweep_dir = submit(template, tmp_path)
    reference = start_run(template, tmp_path / "ref", log=tmp_path / "ref.log")  # straight, local, meanwhile
    element = wait_final(sweep_dir, timeout_s=240)
    elapsed = time.monotonic() - started
    log = slurm_log(sweep_dir)
    assert element["state"] == "COMPLETED", log[-3000:]
    assert reference.wait(timeout=120) == 0
    assert element["restarts"] >= 1
    saves = log.count("saved (requested), stopping for requeue")  # signal -> save -> stop, on each attempt
    assert saves >= 1 and log.count("Requeued job") == saves == element["restarts"], log[-3000:]
    rank1_log = slurm_log(sweep_dir, rank=1)  # the signal reached the other rank too
    assert rank1_log.count("SIGUSR2: requeue requested") >= saves, rank1_log[-3000:]
    assert log.count("resumed from") == element["restarts"]
    final = assert_same_as_straight_run(Path(element["run_dir"]), tmp_path / "ref", steps=20)
    print(f"requeues={element['restarts']} elapsed={elapsed:.0f}s final state sha256={final}")


def test_scontrol_requeue_of_a_running_two_node_element_resumes_it(slurm_cluster, tmp_path):
    template = TEMPLATES / "grpo_two_node.yaml"
    sweep_dir = submit(template, tmp_path)
    run_dir = Path(load_manifest(sweep_dir).entries[0].run_dir)
    job_id = load_manifest(sweep_dir).entries[0].job_id
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # running, with a checkpoint and steps done after it
        ckpt = latest_step(run_dir / "checkpoints") if (run_dir / "checkpoints").exists() else None
        if ckpt and steps_logged(run_dir) > ckpt:
            break
        time.sleep(0.5)
    assert ckpt, slurm_log(sweep_dir)[-3000:]
    logged_before = steps_logged(run_dir)
    slurm_cluster.run(["scontrol", "requeue", job_id])
    reference = start_run(template, tmp_path / "ref", log=tmp_path / "ref.log")  # 2 local ranks
    element = wait_final(sweep_dir, timeout_s=150)
    log = slurm_log(sweep_dir)
    assert element["state"] == "COMPLETED", log[-3000:]
    assert element["restarts"] == 1
    assert "restarts" in (out := hpcrl("status", str(sweep_dir))) and "│ 1 " in out.split("restarts")[1], out
    resumed_at = int(log.split("resumed from")[1].split("at step ")[1].split()[0])
    # its latest periodic checkpoint (it ran on for KillWait=5 s after the requeue: maybe a newer one)
    assert ckpt <= resumed_at < 20 and resumed_at % 4 == 0, (ckpt, resumed_at)
    assert reference.wait(timeout=120) == 0
    final = assert_same_as_straight_run(run_dir, tmp_path / "ref", steps=20)
    print(f"requeued after {logged_before} logged steps, resumed at {resumed_at}, final sha256={final}")
