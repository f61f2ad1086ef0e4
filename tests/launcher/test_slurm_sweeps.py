"""The launcher against the real dev Slurm cluster (marker slurm; elements run the probe entrypoint)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from hpcrl import cli
from hpcrl.config.yaml_io import load_yaml
from hpcrl.launcher.sweep_manifest import load_manifest
from tests.waiting import wait_until

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]


def status(sweep_dir: Path, capsys) -> dict:
    capsys.readouterr()
    assert cli.main(["status", str(sweep_dir), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def wait_final(sweep_dir: Path, capsys, timeout_s: float = 300) -> dict:
    final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}

    def settled() -> dict | None:
        state = status(sweep_dir, capsys)
        return state if all(e["state"] in final for e in state["elements"]) else None

    return wait_until(settled, timeout_s, "every element in a final state", poll_s=1)


def array_jobs_named(cluster, name: str) -> set[str]:
    """Job ids (array ids for arrays) with this name, known to the controller (squeue) or accounting (sacct)."""
    queued = cluster.run(["squeue", "-h", "-o", "%F", f"--name={name}"]).stdout.split()
    done = cluster.run(["sacct", "-X", "-n", "-P", "-o", "JobID", "-S", "now-1hour", f"--name={name}"]).stdout
    return set(queued) | {job.split("_")[0] for job in done.split()}


@pytest.mark.heavy
def test_sweep_of_24_is_one_array_and_all_complete(slurm_cluster, tmp_path, capsys):
    template = REPO / "templates/sweeps/probe-24.yaml"
    name = f"p24-{uuid.uuid4().hex[:6]}"
    common = ["--run_root", str(tmp_path / "runs"), "--name", name]
    assert cli.main(["expand", str(template), "--json", *common]) == 0
    expanded = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    sweep_dir = tmp_path / "sweep"
    assert cli.main(["submit", str(template), "--sweep_dir", str(sweep_dir), *common]) == 0
    manifest = load_manifest(sweep_dir)
    assert len(manifest.arrays) == 1
    assert {e.job_id.split("_")[0] for e in manifest.entries} == {manifest.arrays[0]["job_id"]}
    state = wait_final(sweep_dir, capsys, timeout_s=300)  # a guard: 24 elements on 2 nodes
    assert array_jobs_named(slurm_cluster, f"hpcrl-{name}") == {manifest.arrays[0]["job_id"]}  # ONE sbatch
    assert state["counts"] == {"COMPLETED": 24}, state
    capsys.readouterr()
    assert cli.main(["status", str(sweep_dir)]) == 0
    assert "24/24 finished: 24 COMPLETED" in capsys.readouterr().out
    for entry, shown in zip(load_manifest(sweep_dir).entries, expanded, strict=True):
        run_dir = Path(entry.run_dir)
        assert load_yaml(run_dir / "config.yaml") == shown["config"]
        assert (
            json.loads((run_dir / "probe.json").read_text())["config_id"]
            == shown["config_id"]
            == run_dir.name
        )


@pytest.mark.heavy
def test_element_over_two_nodes_forms_a_four_rank_group(slurm_cluster, tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    assert (
        cli.main(
            [
                "submit",
                str(REPO / "templates/examples/probe-2x2.yaml"),
                "--sweep_dir",
                str(sweep_dir),
                "--run_root",
                str(tmp_path / "runs"),
            ]
        )
        == 0
    )
    state = wait_final(sweep_dir, capsys, timeout_s=180)
    assert state["counts"] == {"COMPLETED": 1}, state
    result = json.loads((Path(state["elements"][0]["run_dir"]) / "probe.json").read_text())
    assert result["world_size"] == 4 and result["all_reduce"] == 10.0
    assert len(set(result["nodes"])) == 2 and result["nodes"][0] == result["nodes"][1]  # 2 ranks per node
    capsys.readouterr()
    assert cli.main(["logs", str(sweep_dir), "0"]) == 0
    assert "Job completed successfully" in capsys.readouterr().out


@pytest.mark.heavy
@pytest.mark.slow
def test_cancel_one_index_then_resume_reruns_only_failed_and_cancelled(slurm_cluster, tmp_path, capsys):
    gate = tmp_path / "gate"  # the elements wait for it: none can complete before element 3 is seen cancelled
    template = tmp_path / "t.yaml"
    template.write_text(
        "extends: " + str(REPO / "templates/base.yaml") + "\n"
        f"name: cr-{uuid.uuid4().hex[:6]}\nentrypoint: hpcrl.launcher.probe:main\nrun_root: {tmp_path / 'runs'}\n"
        f"cluster:\n  profile: local-dev\n  env: {{HPCRL_PROBE_WAIT_FOR: '{gate}', HPCRL_PROBE_FAIL_FIRST_ATTEMPT_SEEDS: '2'}}\n"
        "sweep: {grid: {seed: [1, 2, 3, 4]}}\n"
    )
    sweep_dir = tmp_path / "sweep"
    assert cli.main(["submit", str(template), "--sweep_dir", str(sweep_dir)]) == 0
    assert cli.main(["cancel", str(sweep_dir), "3"]) == 0
    running = wait_until(
        lambda: (s := status(sweep_dir, capsys))["elements"][3]["state"] == "CANCELLED" and s,
        120,
        "element 3 CANCELLED",
    )
    assert all(e["state"] in ("PENDING", "RUNNING", "FAILED") for e in running["elements"][:3]), running
    gate.touch()
    state = wait_final(sweep_dir, capsys)
    assert [e["state"] for e in state["elements"]] == ["COMPLETED", "FAILED", "COMPLETED", "CANCELLED"]
    first_ids = [e["job_id"] for e in state["elements"]]
    assert cli.main(["resume", str(sweep_dir)]) == 0
    manifest = load_manifest(sweep_dir)
    assert len(manifest.arrays) == 2 and manifest.arrays[1]["indices"] == [1, 3]  # ONE new array
    state = wait_final(sweep_dir, capsys)
    assert state["counts"] == {"COMPLETED": 4}, state
    ids = [e["job_id"] for e in state["elements"]]
    assert (
        ids[0] == first_ids[0]
        and ids[2] == first_ids[2]
        and ids[1] != first_ids[1]
        and ids[3] != first_ids[3]
    )
    assert manifest.entries[1].attempts == [first_ids[1]]


def test_dry_run_and_bad_template_submit_no_job(slurm_cluster, tmp_path, capsys):
    name = f"dry-{uuid.uuid4().hex[:6]}"
    sweep_dir = tmp_path / "sweep"
    template = REPO / "templates/sweeps/probe-24.yaml"
    args = ["--sweep_dir", str(sweep_dir), "--run_root", str(tmp_path / "runs"), "--name", name]
    assert cli.main(["submit", str(template), "--dry-run", *args]) == 0
    out = capsys.readouterr().out
    script = (sweep_dir / "sbatch" / "array-0.sh").read_text()
    assert script in out and "#SBATCH --array=0-23%8" in script
    manifest = load_manifest(sweep_dir)
    assert {e.state for e in manifest.entries} == {"DRY_RUN"}
    assert all(Path(e.config_path).is_file() for e in manifest.entries)
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"extends: {template}\nname: {name}\nparallel: {{data: 3}}\n")
    assert cli.main(["submit", str(bad), "--sweep_dir", str(tmp_path / "bad-sweep")]) == 2
    assert not (tmp_path / "bad-sweep").exists()
    # sbatch returns once the controller has the job, so a job sent by the failed submit would show now
    assert array_jobs_named(slurm_cluster, f"hpcrl-{name}") == set()
    # the dry-run script is exactly what a real submit sends (same sweep dir -> same paths)
    assert cli.main(["submit", str(template), *args]) == 0
    submitted = load_manifest(sweep_dir)
    assert submitted.arrays[0]["script"] == script
    assert cli.main(["cancel", str(sweep_dir)]) == 0


@pytest.mark.heavy
def test_hostile_values_reach_the_job_as_inert_data(slurm_cluster, tmp_path, capsys):
    marker = tmp_path / "X"
    hostile = {
        "HPCRL_V_SUBST": f"$(touch {marker})",
        "HPCRL_V_BACKTICK": f"`touch {marker}`",
        "HPCRL_V_SEMI": f"a; touch {marker}",
        "HPCRL_V_GLOB": "* ~ $HOME ${IFS} \\",  # a line break is refused at expand (test_launcher_security.py)
        "HPCRL_V_QUOTES": f"it's \"q\" '; touch {marker}; '",
    }
    template = tmp_path / "t.yaml"
    template.write_text(
        f"extends: {REPO / 'templates/base.yaml'}\nname: sec\nentrypoint: hpcrl.launcher.probe:main\n"
        f"run_root: {tmp_path / 'runs'}\ndata: {{task: {json.dumps(hostile['HPCRL_V_SUBST'])}}}\n"
        f"cluster:\n  profile: local-dev\n  env: {json.dumps(hostile)}\n"
    )
    sweep_dir = tmp_path / "sweep"
    assert cli.main(["submit", str(template), "--sweep_dir", str(sweep_dir)]) == 0
    state = wait_final(sweep_dir, capsys, timeout_s=180)
    assert state["counts"] == {"COMPLETED": 1}, state
    result = json.loads((Path(state["elements"][0]["run_dir"]) / "probe.json").read_text())
    assert {k: result["env"][k] for k in hostile} == hostile  # byte-exact, never evaluated
    assert not marker.exists()
    script = load_manifest(sweep_dir).arrays[0]["script"]
    exports = [line for line in script.split("\nexport ") if line.startswith("HPCRL_V_")]
    assert len(exports) == 5
    for key, value in hostile.items():
        assert f"{key}={shlex.quote(value)}" in script
    assert subprocess.run(["bash", "-n", "-c", script], check=False).returncode == 0


def test_an_unknown_partition_is_exit_2_before_anything_is_written(slurm_cluster, tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    argv = ["submit", str(REPO / "templates/examples/probe-2x2.yaml"), "--sweep_dir", str(sweep_dir)]
    code = cli.main([*argv, "--run_root", str(tmp_path / "runs"), "--cluster.partition", "no_such_partition"])
    err = capsys.readouterr().err
    assert code == 2
    assert "cluster.partition: no partition 'no_such_partition' on this cluster (partitions: debug)" in err
    assert not sweep_dir.exists() and not (tmp_path / "runs").exists()


def test_sbatch_refusal_is_exit_1_with_a_whole_manifest_and_the_reason(
    slurm_cluster, tmp_path, monkeypatch, capsys
):
    """A refusal that only the real submission meets (a QOS submit limit reached after the preflight's
    `sbatch --test-only`): an `sbatch` in front of the real one refuses everything but --test-only."""
    real = shutil.which("sbatch")
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text(
        f'#!/bin/bash\ncase " $* " in *" --test-only "*) exec {real} "$@" ;; esac\n'
        'echo "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy" >&2\nexit 1\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    sweep_dir = tmp_path / "sweep"
    argv = ["submit", str(REPO / "templates/examples/probe-2x2.yaml"), "--sweep_dir", str(sweep_dir)]
    assert cli.main([*argv, "--run_root", str(tmp_path / "runs")]) == 1
    assert "sbatch failed" in capsys.readouterr().err
    manifest = load_manifest(sweep_dir)  # valid JSON: written atomically before and after the attempt
    assert [e.state for e in manifest.entries] == ["SUBMIT_FAILED"] and manifest.arrays == []
    shown = status(sweep_dir, capsys)["elements"][0]
    assert shown["state"] == "SUBMIT_FAILED" and "QOS policy" in shown["reason"]
    assert cli.main(["status", str(sweep_dir)]) == 0
    assert "QOS policy" in capsys.readouterr().out
