"""Pure parts of the launcher: sacct/scontrol parsing, array planning, manifest round trip."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcrl import cli
from hpcrl.experiment.resolve import resolve
from hpcrl.launcher import slurm
from hpcrl.launcher.sweep_manifest import Entry, Manifest, load_manifest

REPO = Path(__file__).resolve().parents[2]


def test_parse_sacct_expands_pending_ranges_and_drops_reasons():
    text = "12_0|COMPLETED\n12_1|CANCELLED by 0\n12_[3-5,9%2]|PENDING\n13|RUNNING\n"
    assert slurm.parse_sacct(text) == {
        "12_0": "COMPLETED",
        "12_1": "CANCELLED",
        "12_3": "PENDING",
        "12_4": "PENDING",
        "12_5": "PENDING",
        "12_9": "PENDING",
        "13": "RUNNING",
    }


@given(st.lists(st.integers(0, 500), min_size=1, max_size=30, unique=True))
def test_expand_job_ids_inverts_slurms_range_notation(tasks):
    tasks = sorted(tasks)
    parts, start = [], tasks[0]
    for prev, cur in zip(tasks, [*tasks[1:], None], strict=True):
        if cur != prev + 1:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
            start = cur
    assert slurm.expand_job_ids(f"7_[{','.join(parts)}%4]") == [f"7_{t}" for t in tasks]


def test_parse_max_array_size():
    assert slurm.parse_max_array_size("MailProg = /bin/true\nMaxArraySize            = 10001\n") == 10001


def test_arrays_are_cut_at_max_array_size_and_split_by_resource_shape(tmp_path):
    template = tmp_path / "t.yaml"
    template.write_text(
        "cluster: {profile: local-dev}\nparallel: {data: 1}\n"
        "sweep:\n  grid: {seed: [0, 1, 2, 3, 4]}\n  list: [{}, {cluster.cpus_per_task: 2}]\n"
    )
    sweep = resolve(template)
    arrays = slurm.plan_arrays(sweep.elements, sweep.name, limit=2)
    assert [len(array.indices) for array in arrays] == [2, 2, 1, 2, 2, 1]
    assert {array.params["cpus_per_task"] for array in arrays[:3]} == {1}
    assert {array.params["cpus_per_task"] for array in arrays[3:]} == {2}
    assert sorted(i for array in arrays for i in array.indices) == list(range(10))


def test_manifest_round_trips_and_rejects_bad_indices(tmp_path):
    entry = Entry(index=0, config_id="abc", config_path="r/config.yaml", run_dir="r", swept={"seed": 1})
    manifest = Manifest(
        sweep_dir=str(tmp_path),
        template="t.yaml",
        name="n",
        executor="slurm",
        created="now",
        keys=["seed"],
        entries=[entry],
    )
    manifest.save()
    assert load_manifest(tmp_path) == manifest
    assert not [p for p in tmp_path.iterdir() if p.name != "manifest.json"], "no temporary file left behind"
    with pytest.raises(Exception, match="outside 0..0"):
        manifest.entry(3)
    (tmp_path / "manifest.json").write_text("{")
    assert cli.main(["status", str(tmp_path)]) == 2


@pytest.mark.heavy
@pytest.mark.slurm
def test_submit_with_slurm_unreachable_is_exit_1_and_writes_nothing(
    slurm_cluster, tmp_path, monkeypatch, capsys
):
    """The dev cluster's slurm.conf with the controller port moved to where nothing listens."""
    conf = slurm_cluster.slurm_conf.read_text()
    dead = tmp_path / "slurm.conf"
    dead.write_text(re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=9", conf))
    monkeypatch.setenv("SLURM_CONF", str(dead))
    sweep_dir = tmp_path / "sweep"
    code = cli.main(
        [
            "submit",
            str(REPO / "templates/sweeps/probe-24.yaml"),
            "--sweep_dir",
            str(sweep_dir),
            "--run_root",
            str(tmp_path / "runs"),
        ]
    )
    assert code == 1
    assert "cluster error" in capsys.readouterr().err
    assert not sweep_dir.exists() and not (tmp_path / "runs").exists()


def test_dry_run_without_slurm_commands_still_renders(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol / sbatch here: a laptop, not a login node
    sweep_dir = tmp_path / "sweep"
    assert (
        cli.main(
            [
                "submit",
                str(REPO / "templates/examples/a100-grpo-sweep.yaml"),
                "--dry-run",
                "--sweep_dir",
                str(sweep_dir),
                "--run_root",
                str(tmp_path / "runs"),
            ]
        )
        == 0
    )
    assert "#SBATCH --gres=gpu:a100:8" in capsys.readouterr().out
    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    assert [e["state"] for e in manifest["entries"]] == ["DRY_RUN"] * 4
