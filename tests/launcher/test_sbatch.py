"""The sbatch script is one pure function; a golden file pins it for the a100-ib profile, as a submit
renders it for the two-node 8xA100 cluster whose `scontrol show partition/node -o` answers are kept
beside it (64 CPUs per node: the profile leaves cpus_per_task to the node, 8 per rank)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcrl.errors import ConfigError
from hpcrl.experiment.resolve import resolve
from hpcrl.launcher import cluster_view, preflight
from hpcrl.launcher.sbatch import mem_text, render_sbatch, sbatch_parameters

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "a100-ib.sbatch"
FOLDER = "/scratch/hpcrl/sweeps/a100-grpo/slurm"
PYTHON = "/opt/hpcrl/.venv/bin/python"


def a100_view() -> cluster_view.ClusterView:
    """The A100-shaped cluster (slurm/a100/start.sh) as its controller described itself."""
    golden = GOLDEN.parent
    return cluster_view.view_from_text(
        "MaxArraySize            = 1001\n",
        (golden / "a100-partitions.txt").read_text(),
        (golden / "a100-nodes.txt").read_text(),
    )


def a100_script() -> str:
    sweep = resolve(REPO / "templates/examples/a100-grpo-sweep.yaml")
    cluster = sweep.elements[0].config.cluster
    fit = preflight.fit(cluster, a100_view())
    assert fit.problems == [] and fit.cpus_per_task == 8  # 64 CPUs / 8 ranks
    params = sbatch_parameters(cluster, sweep.name, cpus_per_task=fit.cpus_per_task)
    return render_sbatch(params, FOLDER, len(sweep.elements), PYTHON)


def test_a100_ib_script_matches_golden_file():
    text = a100_script()
    if os.environ.get("HPCRL_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "rendered sbatch changed; rerun with HPCRL_UPDATE_GOLDEN=1 if intended"
    for line in (
        "#SBATCH --gres=gpu:a100:8",
        "#SBATCH --exclusive",
        "#SBATCH --constraint='a100&ib'",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --array=0-3%4",
        "#SBATCH --cpus-per-task=8",
        "export OMP_NUM_THREADS=8",
        "export NCCL_SOCKET_IFNAME=ib0",
        "export NCCL_IB_GID_INDEX=3",
    ):
        assert line in text.splitlines(), line


def test_render_is_what_submitits_executor_writes(tmp_path):
    if shutil.which("srun") is None:
        pytest.skip("submitit's SlurmExecutor needs srun on PATH")
    import submitit
    from submitit.slurm.slurm import _make_sbatch_string

    sweep = resolve(REPO / "templates/examples/a100-grpo-sweep.yaml")
    params = sbatch_parameters(sweep.elements[0].config.cluster, sweep.name)
    executor = submitit.SlurmExecutor(folder=tmp_path, python=PYTHON)
    executor.update_parameters(**params)
    # exactly what SlurmExecutor._internal_process_submissions renders for an array of 4
    theirs = _make_sbatch_string(
        command=executor._submitit_command_str, folder=executor.folder, map_count=4, **executor.parameters
    )
    assert render_sbatch(params, executor.folder, 4, PYTHON) == theirs


def test_hostile_env_values_stay_inert_in_bash(tmp_path):
    """Values with $(...), backticks, ;, quotes and globs: bash sees data, runs nothing. A line break
    is refused at expand time (every config string is one line), so each export is one script line."""
    marker = tmp_path / "X"
    hostile = {
        "HPCRL_A": f"$(touch {marker})",
        "HPCRL_B": f"`touch {marker}`",
        "HPCRL_C": f"x; touch {marker}",
        "HPCRL_E": f"it's \"quoted\" ' ; touch {marker}",
        "HPCRL_F": "* ~ $HOME ${IFS} !! \\",
    }
    template = tmp_path / "t.yaml"
    template.write_text("cluster:\n  env: " + json.dumps(hostile) + "\n")
    cluster = resolve(template).elements[0].config.cluster
    params = sbatch_parameters(cluster, "x")
    assert len(params["setup"]) == len(hostile)
    script = "\n".join(params["setup"]) + "\n" + "".join(f'printf "%s\\0" "${k}"\n' for k in hostile)
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [v.encode() for v in hostile.values()]
    assert not marker.exists()
    template.write_text("cluster:\n  env: " + json.dumps({"HPCRL_D": f"line1\ntouch {marker}\n"}) + "\n")
    with pytest.raises(ConfigError, match=r"cluster\.env\.HPCRL_D: .* non-printable character '\\n'"):
        resolve(template)


@given(st.floats(min_value=0.001, max_value=1e6, allow_nan=False))
def test_mem_text_writes_mem_as_submitit_does(mem_gb):
    """hpcrl renders --mem itself (submitit's converter is private); the text must stay submitit's."""
    from submitit.slurm.slurm import _convert_mem

    assert mem_text(mem_gb) == _convert_mem(mem_gb)
