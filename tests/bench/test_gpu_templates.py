"""GPU suite templates: each resolves, is predicted to fit an A100 80GB, and passes `submit --dry-run`;
the rendered sbatch script of one is pinned by a golden file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcrl.cli import main as cli_main
from hpcrl.experiment.resolve import resolve
from hpcrl.launcher.sbatch import render_sbatch, sbatch_parameters
from hpcrl.plan.memory import predict

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "templates" / "bench" / "gpu"
TEMPLATES = ["hybridflow-7b.yaml", "hybridflow-13b.yaml", "hybridflow-70b.yaml", "ppo-7b-8xa100.yaml"]
GOLDEN = Path(__file__).parent / "golden" / "hybridflow-7b.sbatch"


@pytest.mark.parametrize("name", TEMPLATES)
def test_gpu_template_fits_and_dry_runs(name, tmp_path):
    sweep = resolve(GPU / name)
    assert len(sweep.elements) >= 2  # every GPU template sweeps layouts
    for element in sweep.elements:
        plan = predict(element.config)
        assert plan.device.name == "A100 80GB" and plan.fits, plan.problems()
    assert cli_main(["submit", str(GPU / name), "--dry-run", "--sweep_dir", str(tmp_path / "sweep")]) == 0
    [script] = (tmp_path / "sweep" / "sbatch").glob("*.sh")
    text = script.read_text()
    assert f"#SBATCH --array=0-{len(sweep.elements) - 1}" in text and "#SBATCH --gres=gpu:a100:8" in text


def test_hybridflow_7b_sbatch_matches_golden_file():
    sweep = resolve(GPU / "hybridflow-7b.yaml")
    params = sbatch_parameters(sweep.elements[0].config.cluster, sweep.name)
    text = render_sbatch(
        params,
        "/scratch/hpcrl/sweeps/hybridflow-7b/slurm",
        len(sweep.elements),
        "/opt/hpcrl/.venv/bin/python",
    )
    if os.environ.get("HPCRL_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "rendered sbatch changed; rerun with HPCRL_UPDATE_GOLDEN=1 if intended"
