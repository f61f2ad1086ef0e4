"""submitit's Slurm executor against the real dev cluster (it relies on sacct, hence slurmdbd)."""

from __future__ import annotations

import threading
import time

import pytest
import submitit

from tests.slurm.cluster import REPO_ROOT
from tests.waiting import wait_until

pytestmark = pytest.mark.slurm


def cube_plus_node(x: int) -> tuple[int, str]:
    import os

    return x**3, os.environ["SLURMD_NODENAME"]


def sleep_then_return(seconds: float) -> str:
    time.sleep(seconds)
    return "finished"


def make_executor(slurm_cluster, folder) -> submitit.AutoExecutor:
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(
        slurm_partition=slurm_cluster.partition,
        timeout_min=5,
        cpus_per_task=1,
        # The job unpickles functions of this test module: run it from the repository root.
        slurm_additional_parameters={"chdir": str(REPO_ROOT)},
    )
    return executor


@pytest.mark.heavy
def test_map_array_over_8_inputs_returns_each_result(slurm_cluster, tmp_path):
    jobs = make_executor(slurm_cluster, tmp_path).map_array(cube_plus_node, range(8))
    assert len({job.job_id.split("_")[0] for job in jobs}) == 1  # one array job
    results = [job.result() for job in jobs]
    assert [value for value, _ in results] == [x**3 for x in range(8)]
    assert {node for _, node in results} <= set(slurm_cluster.nodes)
    array_id = jobs[0].job_id.split("_")[0]
    assert set(slurm_cluster.wait_for_job(array_id, timeout_s=120, num_tasks=8).values()) == {"COMPLETED"}


@pytest.mark.heavy
@pytest.mark.slow  # ~20 s: submitit's result() waits 15 s for a result file that never comes
def test_job_cancelled_from_outside_is_reported_cancelled_and_result_raises(slurm_cluster, tmp_path):
    """submitit sees CANCELLED through sacct, and result() raises instead of hanging.

    `job.state` refreshes lazily (sacct at 0, 2, 4, 8, 16 ... s, then every minute); a forced
    `get_info` asks sacct now. result() of a job that left no result waits `_results_timeout_s` (15 s)
    for a late file before it raises. The 120 s waits below only guard against a hang.
    """
    job = make_executor(slurm_cluster, tmp_path).submit(sleep_then_return, 300)  # outlives every guard
    wait_until(
        lambda: job.get_info(mode="force").get("State") == "RUNNING", 120, f"job {job.job_id} to start"
    )
    slurm_cluster.run(["scancel", job.job_id])
    wait_until(lambda: job.done(force_check=True), 120, f"job {job.job_id} done after scancel")
    assert job.state.startswith("CANCELLED"), job.state

    outcome: dict[str, BaseException | str] = {}

    def wait_for_result() -> None:
        try:
            outcome["value"] = job.result()
        except BaseException as err:  # the exception is what the test inspects
            outcome["error"] = err

    waiter = threading.Thread(target=wait_for_result, daemon=True)
    waiter.start()
    waiter.join(timeout=120)
    assert not waiter.is_alive(), f"job.result() still blocked 120 s after scancel; state={job.state}"
    assert isinstance(outcome.get("error"), submitit.core.utils.UncompletedJobError), outcome
    assert "CANCELLED" in str(outcome["error"])
