"""Element states from `sacct -D` (every attempt of a requeued job): the latest attempt counts, whatever
order sacct prints them in, and an attempt that ended by TIMEOUT/PREEMPTED/NODE_FAIL is not the job's end
while the controller still lists the job (requeued).

The defect: the requeue test's job completed after 5 attempts, but `hpcrl status` had said TIMEOUT (reason
BeginTime: the reason of a requeued attempt) and the test took it as final. No Slurm here: recorded
sacct and squeue answers through a fake `slurm._run`, and one fake `sacct` program for the time format.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.errors import ClusterError
from hpcrl.launcher import slurm

RECORDED = """\
5002|REQUEUED|None|0:0|2026-12-02T02:52:05|2026-12-02T02:52:05
5002|REQUEUED|BeginTime|0:0|2026-12-02T02:52:31|2026-12-02T02:52:37
5002|REQUEUED|BeginTime|0:0|2026-12-02T02:53:31|2026-12-02T02:53:37
5002|REQUEUED|BeginTime|0:0|2026-12-02T02:54:33|2026-12-02T02:54:39
5002|COMPLETED|BeginTime|0:0|2026-12-02T02:55:31|2026-12-02T02:55:37
"""
"""`sacct -D -X -P -n -o JobID,State,Reason,ExitCode,Submit,Start -j 5002` of the requeue test's element
(tests/recovery/test_slurm_requeue.py) on the dev cluster, 2026-12-02: 4 signal-save-requeue attempts,
then the one that completed. Each requeued attempt's Submit is its requeue time."""
TIMED_OUT_THEN_REQUEUED = """\
7|REQUEUED|None|0:0|2026-12-02T03:00:00|2026-12-02T03:00:01
7|TIMEOUT|BeginTime|0:15|2026-12-02T03:01:00|2026-12-02T03:01:06
7|PENDING|BeginTime|0:0|2026-12-02T03:02:07|Unknown
"""
"""The flaky case: an attempt reached the time limit while its requeue was being made (TIMEOUT with the
reason BeginTime of a requeued attempt), and the next attempt waits."""


def fake_cluster(monkeypatch, sacct: str, squeue: str | Exception = "") -> list[list[str]]:
    """slurm._run answering sacct and squeue; returns the commands asked."""
    asked: list[list[str]] = []

    def run(cmd, timeout=60):
        asked.append(list(cmd))
        answer = {"sacct": sacct, "squeue": squeue}.get(cmd[0], ClusterError(f"`{cmd[0]}` unexpected"))
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(slurm, "_run", run)
    return asked


def rows(text: str) -> list[str]:
    return text.splitlines()


def test_the_recorded_requeue_history_is_the_completed_job(tmp_path, monkeypatch):
    asked = fake_cluster(monkeypatch, RECORDED)
    states, note = slurm.element_states(tmp_path, ["5002"])
    assert states == {"5002": slurm.Observed("COMPLETED", "BeginTime")} and note is None
    assert "-D" in asked[0]  # every attempt, not sacct's pick of one


@pytest.mark.parametrize(
    "order",
    [
        [4, 3, 2, 1, 0],  # newest first
        [0, 1, 2, 4, 3],  # a requeued attempt printed after the completed one
        [4, 0],
    ],
)
def test_orders_that_end_on_an_older_attempt_still_give_the_latest(tmp_path, monkeypatch, order):
    lines = rows(RECORDED)
    fake_cluster(monkeypatch, "\n".join(lines[i] for i in order) + "\n")
    states, _ = slurm.element_states(tmp_path, ["5002"])
    assert states["5002"].state == "COMPLETED"


@settings(max_examples=60, deadline=None)
@given(st.permutations(rows(RECORDED)), st.permutations(rows(TIMED_OUT_THEN_REQUEUED)))
def test_any_order_of_the_rows_gives_each_jobs_latest_attempt(recorded, timed_out):
    observed = slurm.parse_history("\n".join([*recorded, *timed_out]))
    assert observed["5002"].state == "COMPLETED"
    assert observed["7"] == slurm.Observed("PENDING", "BeginTime")  # not started yet: the newest


def test_a_timeout_whose_requeue_is_not_recorded_yet_is_what_squeue_says(tmp_path, monkeypatch):
    """sacct has the TIMEOUT attempt but not yet the requeued one; the controller lists the job."""
    ended = "\n".join(rows(TIMED_OUT_THEN_REQUEUED)[:2])
    asked = fake_cluster(monkeypatch, ended, squeue="7|PENDING|BeginTime\n")
    states, _ = slurm.element_states(tmp_path, ["7"])
    assert states == {"7": slurm.Observed("PENDING", "BeginTime")}
    assert [cmd[0] for cmd in asked] == ["sacct", "squeue"]


@pytest.mark.parametrize("end", ["TIMEOUT", "PREEMPTED", "NODE_FAIL"])
def test_a_requeuable_end_still_completing_is_not_final(tmp_path, monkeypatch, end):
    fake_cluster(
        monkeypatch,
        f"9_1|{end}|None|0:15|2026-12-02T03:00:00|2026-12-02T03:00:01\n",
        "9_1|COMPLETING|TimeLimit\n",
    )
    states, _ = slurm.element_states(tmp_path, ["9_1"])
    assert states["9_1"].state == "COMPLETING"


@pytest.mark.parametrize("squeue", ["", ClusterError("`squeue` failed (exit 1): timeout")])
def test_a_timeout_the_controller_no_longer_lists_is_final(tmp_path, monkeypatch, squeue):
    fake_cluster(monkeypatch, "9_1|TIMEOUT|TimeLimit|0:15|2026-12-02T03:00:00|2026-12-02T03:00:01\n", squeue)
    states, _ = slurm.element_states(tmp_path, ["9_1"])
    assert states == {"9_1": slurm.Observed("TIMEOUT", "TimeLimit (exit 0:15)")}


def test_no_squeue_call_when_no_attempt_ended_by_a_requeuable_end(tmp_path, monkeypatch):
    asked = fake_cluster(monkeypatch, RECORDED)
    slurm.element_states(tmp_path, ["5002"])
    assert [cmd[0] for cmd in asked] == ["sacct"]


def test_times_are_asked_for_in_iso_form_whatever_the_users_time_format(tmp_path, monkeypatch):
    """SLURM_TIME_FORMAT=relative makes sacct print '02:52:05' or 'Tue 02:52' (measured): rows would no
    longer order by their text. A fake sacct prints the newest attempt first, with times in the format
    it is asked for."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sacct = bin_dir / "sacct"
    sacct.write_text(
        "#!/bin/sh\n"
        'if [ "$SLURM_TIME_FORMAT" = standard ]; then a=2026-12-02T02:55:31; b=2026-12-02T02:52:05\n'
        "else a=02:55:31; b=Tue; fi\n"
        'printf "5002|COMPLETED|None|0:0|$a|$a\\n5002|TIMEOUT|None|0:15|$b|$b\\n"\n'
    )
    sacct.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")
    states, _ = slurm.element_states(Path(tmp_path), ["5002"])
    assert states["5002"].state == "COMPLETED"


@pytest.mark.parametrize(
    ("recorded", "shown"), [("COMPLETED", "COMPLETED"), ("RUNNING", "TIMEOUT"), (None, "TIMEOUT")]
)
def test_a_run_that_completed_before_the_time_limit_ended_its_exit_is_completed(
    tmp_path, monkeypatch, capsys, recorded, shown
):
    """The clean-clone run of d09a988: the requeue test's last attempt resumed at the last step, did the
    final evaluation and the export (launcher.json COMPLETED), and Slurm's time limit came while its
    processes were exiting: sacct said TIMEOUT, `hpcrl status` showed it, and `resume` would rerun it.
    An attempt that had not completed (RUNNING, or no record) stays TIMEOUT."""
    import json

    from hpcrl.launcher import sweeps
    from hpcrl.launcher.sweep_manifest import load_manifest
    from tests.cli_runs import run_cli
    from tests.templates import write_grpo_template

    template = write_grpo_template(
        tmp_path, "limit", steps=2, eval_every=0, extra="cluster: {profile: local-dev}\n"
    )
    sweep = tmp_path / "sweep"
    assert run_cli(capsys, "submit", template, "--dry-run", "--sweep_dir", sweep)[0] == 0
    data = json.loads((sweep / "manifest.json").read_text())
    data["entries"][0] |= {"job_id": "7", "state": "RUNNING"}
    (sweep / "manifest.json").write_text(json.dumps(data))
    run_dir = Path(data["entries"][0]["run_dir"])
    run_dir.mkdir(parents=True)
    if recorded:
        (run_dir / "launcher.json").write_text(json.dumps({"state": recorded}))
    fake_cluster(monkeypatch, "7|TIMEOUT|None|0:15|2026-12-02T03:01:00|2026-12-02T03:01:06\n")
    [entry] = sweeps.refresh(load_manifest(sweep)).entries
    assert entry.state == shown
    assert (entry.reason == sweeps.COMPLETED_AT_THE_LIMIT) == (shown == "COMPLETED")
