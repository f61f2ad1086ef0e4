"""The launcher against the A100-shaped Slurm cluster (slurm/a100/start.sh: two nodes of 64 CPUs with
Gres=gpu:a100:8, partition `gpu` with MaxTime 2 days, and no accounting: sacct does not work there).

- the GPU templates (a100-ib profile) pass the preflight and Slurm's own `sbatch --test-only`, with the
  CPUs per rank derived from the node (the profile's old 8 x 12 = 96 CPUs did not fit a 64-CPU node);
- oversized requests are exit 2, one line per problem naming its key, nothing submitted, an existing
  manifest untouched;
- without accounting a failed element shows FAILED with its exception as the reason (never a stale
  RUNNING), and `hpcrl resume --cluster.cpus_per_task 2` reruns it, recorded in the manifest.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpcrl import cli
from hpcrl.config.yaml_io import load_yaml
from hpcrl.experiment.ids import config_id
from hpcrl.launcher.sweep_manifest import load_manifest
from tests.waiting import wait_until

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
GPU_TEMPLATES = sorted((REPO / "templates" / "gpu").glob("*.yaml"))


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def queued(cluster) -> list[str]:
    return cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split()


@pytest.mark.parametrize("template", GPU_TEMPLATES, ids=lambda p: p.name)
def test_gpu_templates_pass_the_preflight_and_sbatch_test_only(a100_cluster, template, tmp_path, capsys):
    sweep_dir = tmp_path / "sw"
    code, out, err = run_cli(capsys, "submit", template, "--dry-run", "--sweep_dir", sweep_dir)
    assert code == 0 and "warning" not in err and "note: cluster.cpus_per_task" not in err, err
    script = sweep_dir / "sbatch" / "array-0.sh"
    lines = script.read_text().splitlines()
    assert "#SBATCH --cpus-per-task=8" in lines and "export OMP_NUM_THREADS=8" in lines  # 64 CPUs / 8 ranks
    verdict = a100_cluster.run(["sbatch", "--test-only", str(script)], check=False)
    assert verdict.returncode == 0, verdict.stderr
    old = a100_cluster.run(["sbatch", "--test-only", "--cpus-per-task=12", str(script)], check=False)
    assert "Requested node configuration is not available" in old.stderr  # what the profile asked before


def test_oversized_requests_are_exit_2_one_line_each_and_nothing_is_submitted(a100_cluster, tmp_path, capsys):
    template, sweep_dir = GPU_TEMPLATES[0], tmp_path / "sw"
    assert run_cli(capsys, "submit", template, "--dry-run", "--sweep_dir", sweep_dir)[0] == 0
    manifest = (sweep_dir / "manifest.json").read_bytes()
    before = queued(a100_cluster)
    oversized = ["--cluster.cpus_per_task", "100", "--cluster.time_min", "3000", "--cluster.mem_gb", "2000"]
    code, out, err = run_cli(capsys, "submit", template, "--sweep_dir", sweep_dir, *oversized)
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert code == 2 and err.splitlines()[0] == "hpcrl: 3 problem(s):" and len(problems) == 3, err
    assert problems[0].startswith(
        "  - cluster.time_min: 3000 min is above partition gpu's MaxTime 2-00:00:00"
    )
    assert problems[1].startswith("  - cluster.cpus_per_task: 8 tasks x 100 CPUs = 800 CPUs per node")
    assert problems[2].startswith("  - cluster.mem_gb: 2000 GB per node, but partition gpu's nodes have")
    code, _, err = run_cli(
        capsys, "submit", template, "--sweep_dir", sweep_dir, "--cluster.partition", "nope"
    )
    assert code == 2 and err.splitlines() == [
        "hpcrl: 1 problem(s):",
        "  - cluster.partition: no partition 'nope' on this cluster (partitions: gpu)",
    ]
    assert (sweep_dir / "manifest.json").read_bytes() == manifest
    assert not (sweep_dir / "slurm").exists() and queued(a100_cluster) == before


@pytest.mark.heavy
def test_without_accounting_a_failure_shows_its_reason_and_resume_reruns_it(a100_cluster, tmp_path, capsys):
    template = tmp_path / "t.yaml"
    template.write_text(
        f"extends: {REPO / 'templates/base.yaml'}\nname: noacct\nentrypoint: hpcrl.launcher.probe:main\n"
        f"run_root: {tmp_path / 'runs'}\nseed: 2\n"
        "cluster:\n  executor: slurm\n  partition: gpu\n  time_min: 10\n  signal_delay_s: 30\n"
        "  env: {OMP_NUM_THREADS: '1', HPCRL_PROBE_FAIL_FIRST_ATTEMPT_SEEDS: '2'}\n"
    )
    sweep_dir = tmp_path / "sw"
    assert run_cli(capsys, "submit", template, "--sweep_dir", sweep_dir)[0] == 0
    first = wait_final(sweep_dir, capsys)
    assert first["state"] == "FAILED", first
    assert first["reason"] == "RuntimeError: probe: seed 2 fails its first attempt on purpose"
    code, out, err = run_cli(capsys, "status", sweep_dir)
    assert "hpcrl: note: no accounting (" in err and "probe: seed 2 fails" in out
    code, out, _ = run_cli(capsys, "resume", sweep_dir, "--cluster.cpus_per_task", "2")
    assert code == 0 and "with cluster.cpus_per_task=2" in out
    manifest = load_manifest(sweep_dir)
    assert manifest.arrays[1]["overrides"] == {"cluster.cpus_per_task": 2}
    assert "#SBATCH --cpus-per-task=2" in manifest.arrays[1]["script"]
    assert "#SBATCH --cpus-per-task=64" in manifest.arrays[0]["script"]  # derived: 64 CPUs / 1 task
    entry = manifest.entries[0]
    written = load_yaml(Path(entry.config_path))
    assert written["cluster"]["cpus_per_task"] == 2 and config_id(written) == entry.config_id
    assert Path(entry.config_path).parent == Path(entry.run_dir) and entry.attempts == [first["job_id"]]
    second = wait_final(sweep_dir, capsys)
    assert second["state"] == "COMPLETED" and second["reason"] is None, second
    result = json.loads((Path(entry.run_dir) / "probe.json").read_text())
    assert result["config_id"] == entry.config_id


def wait_final(sweep_dir: Path, capsys, timeout_s: float = 300) -> dict:
    """The element's status once it left PENDING/RUNNING (the only one of the sweep); `timeout_s` a guard."""

    def final() -> dict | None:
        code, out, _ = run_cli(capsys, "status", sweep_dir, "--json")
        assert code == 0
        element = json.loads(out)["elements"][0]
        return None if element["state"] in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED") else element

    return wait_until(final, timeout_s, "the element to leave PENDING/RUNNING", poll_s=1)


def test_the_cluster_scripts_are_safe_to_call_twice(a100_cluster):
    """start.sh is idempotent (a running cluster is reused, SLURM_CONF printed last)."""
    proc = subprocess.run(
        ["bash", str(REPO / "slurm/a100/start.sh")], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == f"SLURM_CONF={a100_cluster.slurm_conf}"
