"""Saving before the time limit WITHOUT a warning signal, in a real Slurm job (`--time=1`, no --signal):
the time left comes from Slurm (squeue) and the rule compares it with the measured step and save times.
Steps of 5 s and a 4x margin: the job steps on while more than 20 s are left, then saves a real checkpoint
and stops at the first boundary with less, 15-20 s before Slurm's limit, however long it took to start.
(Steps of 25 s at a 1.5x margin stopped at the first boundary, whose time left was what the start-up
left of the minute less 25 s: a start-up of ~35 s on a loaded machine left none, and Slurm killed the job
as it wrote its result: TIMEOUT in a loaded clean-clone run of 37a2353.)"""

from __future__ import annotations

import json
import sys

import pytest

from hpcrl.ckpt.commit import read_latest
from hpcrl.ckpt.manifest import read_manifest
from tests.recovery._runs import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEP_S, SAFETY = 5.0, 4.0


@pytest.mark.heavy
def test_the_time_limit_rule_saves_and_stops_before_the_limit(slurm_cluster, tmp_path):
    result = tmp_path / "result.json"
    job = slurm_cluster.sbatch(
        [
            "--time=1",
            f"--output={tmp_path}/job.out",
            f"--chdir={REPO}",
            "--wrap",
            f"{sys.executable} -m tests.recovery._deadline_job {tmp_path / 'ckpt'} {result} {STEP_S} {SAFETY}",
        ]
    )
    states = slurm_cluster.wait_for_job(job, timeout_s=300)  # a guard: pending time included
    # COMPLETED, not TIMEOUT: it stopped on its own before Slurm killed it at the limit
    assert states == {job: "COMPLETED"}, (tmp_path / "job.out").read_text()[-2000:]
    seen = json.loads(result.read_text())
    # read from Slurm, not assumed (how much of the minute is left depends on how fast the job started)
    assert 0 < seen["time_left_at_start_s"] <= 60
    *early, last = seen["boundaries"]
    assert last["reasons"] == ["deadline"] and last["time_left_s"] > 0
    assert last["time_left_s"] < SAFETY * STEP_S  # the rule fired because the next step would not fit...
    assert all(b["time_left_s"] >= SAFETY * STEP_S and not b["reasons"] for b in early)  # ...and not before
    assert read_manifest(read_latest(tmp_path / "ckpt")).state["step"] == last["step"]
