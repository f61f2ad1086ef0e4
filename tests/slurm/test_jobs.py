"""Jobs on the real dev cluster: array jobs, multi-node torch.distributed, sacct."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.slurm.cluster import REPO_ROOT

pytestmark = pytest.mark.slurm


@pytest.mark.heavy
def test_array_of_8_tasks_writes_8_outputs(slurm_cluster, tmp_path):
    program = "import os; i = int(os.environ['SLURM_ARRAY_TASK_ID']); print(i, i * i, os.environ['SLURMD_NODENAME'])"
    job_id = slurm_cluster.sbatch(
        ["--array=0-7", f"--output={tmp_path}/task-%a.out", "--wrap", f'{sys.executable} -c "{program}"']
    )
    states = slurm_cluster.wait_for_job(job_id, timeout_s=120, num_tasks=8)
    assert states == {f"{job_id}_{i}": "COMPLETED" for i in range(8)}
    rows = [(tmp_path / f"task-{i}.out").read_text().split() for i in range(8)]
    assert [(int(index), int(square)) for index, square, _ in rows] == [(i, i * i) for i in range(8)]
    assert {node for _, _, node in rows} <= set(slurm_cluster.nodes)


@pytest.mark.heavy
def test_two_nodes_times_two_tasks_form_a_four_rank_gloo_group(slurm_cluster, tmp_path):
    out = tmp_path / "job.out"
    job_id = slurm_cluster.sbatch(
        [
            "--nodes=2",
            "--ntasks-per-node=2",
            f"--chdir={REPO_ROOT}",
            f"--output={out}",
            "--wrap",
            f"srun {sys.executable} -m tests.slurm.allreduce_rank",
        ]
    )
    states = slurm_cluster.wait_for_job(job_id, timeout_s=180)
    text = out.read_text()
    assert states == {job_id: "COMPLETED"}, text
    records = [json.loads(line[len("RESULT ") :]) for line in text.splitlines() if line.startswith("RESULT ")]
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3], text
    assert {r["sum"] for r in records} == {1.0 + 2 + 3 + 4}
    assert {(r["world_size"], r["local_world_size"], r["source"], r["backend"]) for r in records} == {
        (4, 2, "slurm", "gloo")
    }
    by_node = {}
    for r in records:
        assert r["node_name"] == r["slurmd_nodename"]
        by_node.setdefault(r["slurmd_nodename"], set()).add((r["node_rank"], r["local_rank"]))
    assert len(by_node) == 2, f"ranks should span 2 nodes: {by_node}"
    assert sorted(by_node.values(), key=sorted) == [{(0, 0), (0, 1)}, {(1, 0), (1, 1)}]
    assert {r["master"] for r in records} == {records[0]["master"]}  # every rank found the same store


def test_sacct_reports_the_state_and_exit_code_of_finished_jobs(slurm_cluster, tmp_path):
    ok = slurm_cluster.sbatch([f"--output={tmp_path}/ok.out", "--wrap", "true"])
    bad = slurm_cluster.sbatch([f"--output={tmp_path}/bad.out", "--wrap", "exit 3"])
    assert slurm_cluster.wait_for_job(ok, timeout_s=120) == {ok: "COMPLETED"}
    assert slurm_cluster.wait_for_job(bad, timeout_s=120) == {bad: "FAILED"}
    exit_code = slurm_cluster.run(["sacct", "-j", bad, "-X", "-n", "-P", "-o", "ExitCode"]).stdout.strip()
    assert exit_code == "3:0"


@pytest.mark.heavy
def test_wait_for_job_times_out_with_the_states_it_saw(slurm_cluster, tmp_path):
    job_id = slurm_cluster.sbatch([f"--output={Path(tmp_path) / 'sleep.out'}", "--wrap", "sleep 60"])
    try:
        with pytest.raises(TimeoutError, match=f"job {job_id} not finished after 1"):
            slurm_cluster.wait_for_job(job_id, timeout_s=1.5)  # a `sleep 60` job cannot end in 1.5 s
    finally:
        slurm_cluster.run(["scancel", job_id])
    assert slurm_cluster.wait_for_job(job_id, timeout_s=120) == {job_id: "CANCELLED"}
