"""The local executor: `hpcrl run` (in-process and N local ranks) and a non-blocking local sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl import cli
from hpcrl.config.yaml_io import load_yaml
from hpcrl.launcher import local
from hpcrl.launcher.sweep_manifest import load_manifest
from tests.waiting import wait_until

PROBE = "entrypoint: hpcrl.launcher.probe:main\n"


def test_run_one_rank_in_process_prints_run_dir_first(tmp_path, capsys):
    template = tmp_path / "t.yaml"
    template.write_text(
        PROBE + f"name: one\nrun_root: {tmp_path / 'runs'}\ncluster: {{env: {{HPCRL_PROBE_VALUE: 'a;b'}}}}\n"
    )
    assert cli.main(["run", str(template)]) == 0
    first_line = capsys.readouterr().out.splitlines()[0]
    assert first_line.startswith("run dir: ")
    run_dir = Path(first_line.removeprefix("run dir: "))
    result = json.loads((run_dir / "probe.json").read_text())
    assert result["world_size"] == 1 and result["all_reduce"] == 1.0
    assert result["config_id"] == run_dir.name  # the id the rank computes from what it received
    assert result["env"] == {"HPCRL_PROBE_VALUE": "a;b"}
    assert json.loads((run_dir / "launcher.json").read_text())["state"] == "COMPLETED"


@pytest.mark.heavy
@pytest.mark.dist
def test_run_two_local_ranks_forms_a_group_and_the_launcher_imports_no_torch(tmp_path):
    """`hpcrl run` of N > 1 ranks only supervises them: the rank server imports torch and megatron-core
    for its ranks, and the launcher importing torch too cost ~1.3 s of CPU a run. A fresh interpreter."""
    template = tmp_path / "t.yaml"
    template.write_text(
        PROBE + f"run_root: {tmp_path / 'runs'}\nparallel: {{data: 2}}\ncluster: {{tasks_per_node: 2}}\n"
    )
    child = (
        "import sys\nfrom hpcrl.cli import main\ncode = main(sys.argv[1:])\n"
        "print(code, sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron', 'transformers'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child, "run", str(template)], capture_output=True, text=True, timeout=300
    )
    lines = done.stdout.splitlines()
    assert lines[-1] == "0 []", done.stdout[-2000:] + done.stderr[-2000:]
    run_dir = Path(lines[0].removeprefix("run dir: "))
    result = json.loads((run_dir / "probe.json").read_text())
    assert result["world_size"] == 2 and result["all_reduce"] == 3.0


def test_run_of_a_sweep_needs_an_index(tmp_path, capsys):
    template = tmp_path / "t.yaml"
    template.write_text(PROBE + "sweep: {grid: {seed: [1, 2]}}\n")
    assert cli.main(["run", str(template)]) == 2
    assert "pick one with --index" in capsys.readouterr().err


@pytest.mark.heavy
@pytest.mark.dist
def test_local_sweep_is_non_blocking_and_reports_status(tmp_path, capsys):
    gate = tmp_path / "gate"  # the probe ranks wait for this file: no element can finish before it exists
    template = tmp_path / "t.yaml"
    template.write_text(
        PROBE + f"name: loc\nrun_root: {tmp_path / 'runs'}\n"
        f"cluster: {{array_parallelism: 2, env: {{HPCRL_PROBE_WAIT_FOR: '{gate}'}}}}\n"
        "sweep: {grid: {seed: [1, 2]}}\n"
    )
    sweep_dir = tmp_path / "sweep"
    assert cli.main(["expand", str(template), "--json"]) == 0
    expanded = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert cli.main(["submit", str(template), "--sweep_dir", str(sweep_dir)]) == 0

    def counts() -> dict:
        capsys.readouterr()
        assert cli.main(["status", str(sweep_dir), "--json"]) == 0
        return json.loads(capsys.readouterr().out)["counts"]

    # submit returned while the gate is shut, so it did not wait for the elements
    assert "COMPLETED" not in counts(), "submit must not wait for the elements"
    gate.touch()
    wait_until(lambda: counts() == {"COMPLETED": 2}, 300, "both elements COMPLETED")
    manifest = load_manifest(sweep_dir)
    for entry, shown in zip(manifest.entries, expanded, strict=True):
        assert load_yaml(entry.config_path) == shown["config"]
        assert entry.config_id == shown["config_id"]
    assert cli.main(["logs", str(sweep_dir), "1"]) == 0
    assert "1.log" in capsys.readouterr().out

    # issue 12: a second submit into the same sweep dir used to replace the manifest silently
    before = (sweep_dir / "manifest.json").read_bytes()
    assert cli.main(["submit", str(template), "--sweep_dir", str(sweep_dir)]) == 2
    err = capsys.readouterr().err
    assert "--sweep_dir" in err and "holds a submitted sweep" in err and "--force" in err, err
    assert (sweep_dir / "manifest.json").read_bytes() == before
    dry = tmp_path / "dry"  # a dry run's directory may be reused
    for _ in range(2):
        assert cli.main(["submit", str(template), "--sweep_dir", str(dry), "--dry-run"]) == 0


@pytest.mark.dist
def test_a_cancel_while_the_rank_server_still_imports_starts_no_rank(tmp_path, capsys):
    """`hpcrl cancel` right after a local element started: its TERM reaches the rank server while it
    preloads (the entrypoint's module holds it there, at a gate), before any rank exists. The server
    ignored it, then forked ranks that nobody stopped; now it holds the signal and dies of it."""
    gate = tmp_path / "gate"
    template = tmp_path / "t.yaml"
    template.write_text(
        f"entrypoint: tests.launcher._gated_import:main\nname: early\nrun_root: {tmp_path / 'runs'}\n"
        f"parallel: {{data: 2}}\ncluster: {{tasks_per_node: 2, env: {{HPCRL_TEST_IMPORT_GATE: '{gate}'}}}}\n"
    )
    sweep_dir = tmp_path / "sweep"
    assert cli.main(["submit", str(template), "--sweep_dir", str(sweep_dir)]) == 0
    importing = Path(f"{gate}.importing")
    wait_until(importing.exists, 120, "the rank server preloading the entrypoint")
    pgid = local.read_state(sweep_dir, 0)["pgid"]
    assert int(importing.read_text()) == pgid  # the server itself, before any fork
    assert cli.main(["cancel", str(sweep_dir)]) == 0
    gate.touch()
    wait_until(lambda: not local.pid_alive(pgid), 120, "the rank server gone")
    [run_dir] = [p.parent for p in (tmp_path / "runs").glob("*/*/config.yaml")]
    assert not list(run_dir.glob("ran_*"))  # no rank ran
    capsys.readouterr()
    assert cli.main(["status", str(sweep_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == {"CANCELLED": 1}


@pytest.mark.dist
def test_local_cancel_stops_running_and_pending_elements(tmp_path, capsys):
    template = tmp_path / "t.yaml"
    template.write_text(
        PROBE + f"name: lc\nrun_root: {tmp_path / 'runs'}\n"
        f"cluster: {{array_parallelism: 1, env: {{HPCRL_PROBE_WAIT_FOR: '{tmp_path / 'never'}'}}}}\n"
        "sweep: {grid: {seed: [1, 2]}}\n"
    )  # the gate never opens: element 0 runs until cancelled, however slow the machine
    sweep_dir = tmp_path / "sweep"
    assert cli.main(["submit", str(template), "--sweep_dir", str(sweep_dir)]) == 0
    wait_until(lambda: local.read_state(sweep_dir, 0).get("state") == "RUNNING", 120, "element 0 RUNNING")
    pgid = local.read_state(sweep_dir, 0)["pgid"]
    assert cli.main(["cancel", str(sweep_dir)]) == 0
    wait_until(lambda: not local.pid_alive(pgid), 120, "the running element's ranks stopped")

    def counts() -> dict:
        capsys.readouterr()
        assert cli.main(["status", str(sweep_dir), "--json"]) == 0
        return json.loads(capsys.readouterr().out)["counts"]

    wait_until(lambda: counts() == {"CANCELLED": 2}, 120, "both elements CANCELLED")
