"""The element runner: requeue hook, entrypoint loading, and the shell wrapper launch/hpcrl-sbatch."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import submitit

from hpcrl.errors import ConfigError
from hpcrl.launcher import element, sweeps

REPO = Path(__file__).resolve().parents[2]


def test_checkpoint_requeues_the_same_element(tmp_path):
    task = element.ElementTask()
    delayed = task.checkpoint("cfg.yaml", str(tmp_path))
    assert isinstance(delayed, submitit.helpers.DelayedSubmission)
    assert delayed.function is task and delayed.args == ("cfg.yaml", str(tmp_path))
    assert json.loads((tmp_path / element.LAUNCHER_STATE).read_text())["state"] == "REQUEUED"


def test_bad_entrypoint_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot load entrypoint 'hpcrl.nothing:main'"):
        element.load_entrypoint("hpcrl.nothing:main")


def test_hpcrl_sbatch_wrapper_submits_through_slurm_dry_run(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    out = subprocess.run(
        [
            str(REPO / "launch/hpcrl-sbatch"),
            str(REPO / "templates/base.yaml"),
            "--dry-run",
            "--cluster.partition",
            "debug",
            "--sweep_dir",
            str(tmp_path / "s"),
            "--run_root",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --partition=debug" in out.stdout and "nothing submitted" in out.stdout
    assert (
        subprocess.run([str(REPO / "launch/hpcrl-sbatch")], capture_output=True, check=False).returncode == 2
    )


def test_an_in_process_run_leaves_no_rank_variables_behind(tmp_path, monkeypatch):
    """A 1-rank element runs inside the caller; later sbatch calls from that process must not inherit
    its MASTER_PORT/RANK (two array elements would otherwise fight over one port)."""
    from hpcrl.cli import main

    repo = Path(__file__).resolve().parents[2]
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "kept.example")
    template = tmp_path / "probe.yaml"
    template.write_text(
        f"extends: {repo / 'templates' / 'base.yaml'}\nname: probe1\nentrypoint: hpcrl.launcher.probe:main\n"
        f"run_root: {tmp_path / 'runs'}\n"
    )
    assert main(["run", str(template)]) == 0
    assert os.environ["MASTER_ADDR"] == "kept.example"
    assert not {"MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"} & os.environ.keys()


def test_an_in_process_run_restores_the_callers_environment(tmp_path, monkeypatch):
    """`cluster.env` of a 1-rank `hpcrl run` is set for the run only: a name the caller had gets its value
    back, a name it did not have is gone (before, both stayed in the caller's os.environ)."""
    from hpcrl.cli import main

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("HPCRL_PROBE_MARK", raising=False)
    template = tmp_path / "probe.yaml"
    template.write_text(
        f"extends: {repo / 'templates' / 'base.yaml'}\nname: probe2\nentrypoint: hpcrl.launcher.probe:main\n"
        f"run_root: {tmp_path / 'runs'}\ncluster: {{env: {{OMP_NUM_THREADS: '1', HPCRL_PROBE_MARK: set}}}}\n"
    )
    before = dict(os.environ)
    assert main(["run", str(template)]) == 0
    [probe] = (tmp_path / "runs").glob("probe2/*/probe.json")
    assert json.loads(probe.read_text())["env"] == {"OMP_NUM_THREADS": "1", "HPCRL_PROBE_MARK": "set"}
    assert dict(os.environ) == before


def test_unpickling_the_element_task_imports_no_torch():
    """submitit unpickles ElementTask (importing its module) BEFORE it installs its signal handlers, so a
    time-limit USR2 in that window kills the rank with the default action. With torch imported there the
    window grew ~3x and a loaded node's requeued attempt died of "User defined signal 2" (FAILED)."""
    child = (
        "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'h5py', 'megatron', 'transformers')))"
    )
    blob = pickle.dumps(element.ElementTask())
    proc = subprocess.run([sys.executable, "-c", child], input=blob, capture_output=True, check=True)
    assert proc.stdout.decode().strip() == "[]", proc.stdout.decode()[:2000]


@pytest.mark.parametrize(
    ("ending", "after", "state"),
    [
        (SystemExit(-1), "saved", "REQUEUED"),
        (SystemExit(-1), "raised", "REQUEUED"),
        (submitit.core.utils.UncompletedJobError("timed-out too many times"), "saved", "FAILED"),
    ],
    ids=["requeued-then-saved", "requeued-then-raised", "refused"],
)
def test_a_requeue_from_the_term_handler_ends_rank_0_after_the_run_and_stays_requeued(
    tmp_path, ending, after, state
):
    """Rank 0's TERM handler hands the requeue to submitit, which writes REQUEUED (ElementTask.checkpoint)
    and then either exits once `scontrol requeue` took (SystemExit) or refuses (no requeue left:
    UncompletedJobError); the lifecycle holds that ending while the ranks save at the step boundary, and
    rank 0 raises it once the entrypoint returned. Whatever ends the attempt after a requeue that took,
    Slurm runs the job again: REQUEUED stays; a refused one ends the job, and launcher.json says FAILED."""
    from hpcrl.distributed.env import DistEnv
    from hpcrl.experiment.config import ExperimentConfig
    from hpcrl.lifecycle import Lifecycle

    def entrypoint(cfg, run_dir, lifecycle):
        element.ElementTask().checkpoint("cfg.yaml", str(run_dir))  # what submitit's handler calls first
        lifecycle.requeued_at_term, lifecycle.term_requeue_ending = True, ending
        if after == "raised":  # e.g. another rank SIGKILLed mid-collective
            raise RuntimeError("a collective broke")
        lifecycle.stop_for_termination()  # saved at the step boundary
        return "saved"

    env, lifecycle = DistEnv.from_environ(), Lifecycle()
    raised = RuntimeError if after == "raised" else type(ending)
    with element.scoped_environ(env.torchrun_environ()), pytest.raises(raised):
        result = element._run_in_group(entrypoint, ExperimentConfig(), env, tmp_path, lifecycle, None)
        element._finish(result, env, tmp_path, lifecycle)
    assert json.loads((tmp_path / element.LAUNCHER_STATE).read_text())["state"] == state


@pytest.mark.parametrize("stage", ["starting", "lifecycle_made", "stopped_for_requeue", "term_handler"])
def test_a_requeue_by_submitits_own_handler_says_the_attempt_was_starting(tmp_path, capsys, stage):
    """submitit's handler holds USR2 until hpcrl's is installed: a time limit that comes while the attempt
    still imports or loads its config is requeued by submitit alone (ElementTask.checkpoint), and must say
    so as the other requeue paths say theirs; the next attempt unpickles no lifecycle of this one."""
    from hpcrl.lifecycle import Lifecycle

    task = element.ElementTask()
    if stage != "starting":
        task._lifecycle = Lifecycle()
    if stage == "stopped_for_requeue":
        task._lifecycle.stop_for_requeue()  # saved and stopped: `_requeue` calls checkpoint
    if stage == "term_handler":
        task._lifecycle.requeued_at_term = True  # the TERM handler said its own line first
    delayed = task.checkpoint("cfg.yaml", str(tmp_path))
    said = element.REQUEUED_WHILE_STARTING in capsys.readouterr().err
    assert said == (stage in ("starting", "lifecycle_made"))
    assert json.loads((tmp_path / element.LAUNCHER_STATE).read_text())["state"] == "REQUEUED"
    assert vars(pickle.loads(pickle.dumps(delayed.function))) == {}


def test_a_requeue_submitit_refuses_while_the_attempt_starts_ends_the_element_failed(
    tmp_path, capsys, monkeypatch
):
    """submitit calls checkpoint before it checks its requeue countdown: with none left it then refuses,
    the job ends, and launcher.json must say FAILED, not REQUEUED."""
    monkeypatch.setattr(element, "requeues_left", lambda: -1)
    element.ElementTask().checkpoint("cfg.yaml", str(tmp_path))
    assert element.ENDED_WHILE_STARTING in capsys.readouterr().err
    state = json.loads((tmp_path / element.LAUNCHER_STATE).read_text())
    assert state["state"] == "FAILED" and state["error"] == element.ENDED_WHILE_STARTING


def test_a_slurm_rank_imports_megatron_without_compiling_its_fusions():
    """submitit starts each rank of a Slurm element as a fresh interpreter that calls ElementTask: on a
    CPU node megatron-core's fusions must be off before the entrypoint imports it (~2.5 s of CPU a rank
    spent compiling them through torch dynamo, for nothing). A fresh interpreter, the entrypoint stubbed."""
    probe = (
        "import hpcrl.launcher.element as element\n"
        "element.run_element = lambda config_path, run_dir, lifecycle: None\n"
        "element.ElementTask()('config.yaml', 'run')\n"
        "from megatron.core import jit\n"
        "import torch\n"
        "print(jit.jit_fuser.__name__, torch.cuda.is_available())\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    fuser, cuda = out.stdout.split()[-2:]
    assert fuser == ("compile" if cuda == "True" else "noop_decorator")


@pytest.mark.parametrize("kind", ["fifo", "symlink", "huge", "deep", "not_utf8", "a_list"])
def test_a_launcher_json_that_is_not_ours_is_never_read_whole_nor_followed_and_is_replaced(tmp_path, kind):
    """launcher.json is the launcher's, but the run directory is the user's: a FIFO in its place would hang
    the launcher's reader (and `hpcrl status`), a symlink would send the FAILED record elsewhere, a huge
    file would be read whole. Each reads as no state; the launcher's record replaces the file itself."""
    path = tmp_path / element.LAUNCHER_STATE
    elsewhere = tmp_path / "elsewhere.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        elsewhere.write_text(json.dumps({"state": "RUNNING"}))
        path.symlink_to(elsewhere)
    elif kind == "huge":
        with open(path, "wb") as file:
            file.truncate(element.MAX_LAUNCHER_STATE_BYTES + 1)
    else:
        path.write_bytes(
            {"deep": b"[" * 100_000, "not_utf8": b'{"state": "\xff"}', "a_list": b'["RUNNING"]'}[kind]
        )
    assert element.read_launcher_state(tmp_path) == {}
    assert sweeps.launcher_record(str(tmp_path)) == {}
    element._write_state(tmp_path, state="FAILED")
    assert path.is_file() and not path.is_symlink()
    assert json.loads(path.read_text())["state"] == "FAILED"
    if kind == "symlink":
        assert json.loads(elsewhere.read_text()) == {"state": "RUNNING"}  # the link's target untouched
