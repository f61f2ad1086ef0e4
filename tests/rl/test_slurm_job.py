"""The RL main job as Slurm array elements on the dev cluster, through `hpcrl submit` / `hpcrl status`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from hpcrl import cli
from hpcrl.launcher.sweep_manifest import load_manifest
from hpcrl.metrics.sinks import read_jsonl
from tests.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def _status(sweep_dir: Path, capsys) -> dict:
    capsys.readouterr()
    assert cli.main(["status", str(sweep_dir), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.heavy
def test_grpo_tiny_d2_and_t2_elements_run_as_one_array(slurm_cluster, tmp_path, capsys, monkeypatch):
    # sbatch exports this process's environment; a MASTER_PORT left here by an earlier in-process
    # run_ranks would override the per-job port and make the two concurrent elements collide on it
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    template = REPO / "templates/sweeps/rl-grpo-layouts.yaml"
    sweep_dir, name = tmp_path / "sweep", f"rlg-{uuid.uuid4().hex[:6]}"
    args = ["--sweep_dir", str(sweep_dir), "--run_root", str(tmp_path / "runs"), "--name", name]
    assert cli.main(["submit", str(template), *args]) == 0
    manifest = load_manifest(sweep_dir)
    assert len(manifest.arrays) == 1 and len(manifest.entries) == 3  # one sbatch, three elements

    def finished() -> dict | None:
        state = _status(sweep_dir, capsys)
        return state if all(e["state"] in FINAL for e in state["elements"]) else None

    state = wait_until(finished, 240, "every element in a final state", poll_s=3)
    assert state["counts"] == {"COMPLETED": 3}, state
    runs = []
    for entry in manifest.entries:
        rows = read_jsonl(Path(entry.run_dir) / "metrics.jsonl")
        assert [r["step"] for r in rows] == [0, 1, 2, 3, 4], entry.run_dir  # 4 steps + final evaluation
        assert (Path(entry.run_dir) / "checkpoints" / "latest").exists()
        runs.append(rows)
    for rows in runs[:2]:  # colocated: reshard inside the loop (t=2 -> t_g=1), no staleness
        assert all(r["mismatch/logprob_max"] < 1e-5 for r in rows[:4])
    # async: the two pools are the element's two Slurm tasks; every batch at most one update old
    assert [r["async/version_lag_max"] for r in runs[2][:4]] == [0.0, 1.0, 1.0, 1.0], runs[2]
    assert runs[2][0]["mismatch/logprob_max"] < 1e-5  # step 0: both pools hold the initial weights
    # d=2 and t=2 draw the same samples: the same rewards on both layouts (2 ranks each, checked by the job)
    assert [r.get("reward/mean") for r in runs[0]] == [r.get("reward/mean") for r in runs[1]]
    capsys.readouterr()
    assert cli.main(["status", str(sweep_dir)]) == 0
    assert "3 COMPLETED" in capsys.readouterr().out
