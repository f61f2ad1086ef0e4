"""A sweep directory is read back as untrusted data: each defect the hostile-input check found, as a test
that failed before its fix.

The directory given on the command line is the sweep directory (the manifest's own `sweep_dir` field
is not followed: a copied or moved sweep works, and nothing outside it is touched); a manifest of the
wrong shape is exit 2 naming the file and key; job ids that become file names are checked; FIFOs,
devices and huge files in a sweep are refused without hanging; `cancel` signals only a process group
that is really the element's; `resume` checks its overrides even when there is nothing to resume.
No Slurm: dry-run sweeps and hand-made files.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcrl import cli
from hpcrl.errors import ConfigError
from hpcrl.launcher import local, slurm, sweeps
from hpcrl.launcher.sweep_manifest import MANIFEST, load_manifest, manifest_from_json
from tests.hostile_paths import Sandbox, hostile_paths
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "templates" / "grpo_tiny.yaml"
pytestmark = pytest.mark.timeout(300)  # a guard against a hang only


def run_cli(capsys, *argv: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def dry_sweep(tmp_path_factory) -> Path:
    """One dry-run sweep of the tiny GRPO template, made once; tests copy it."""
    root = tmp_path_factory.mktemp("dry")
    assert cli.main(["submit", str(TEMPLATE), "--dry-run", "--sweep_dir", str(root / "s1")]) == 0
    return root / "s1"


@pytest.fixture
def sweep(dry_sweep, tmp_path) -> Path:
    shutil.copytree(dry_sweep, tmp_path / "s1")
    return tmp_path / "s1"


def manifest_data(sweep: Path) -> dict[str, Any]:
    return json.loads((sweep / MANIFEST).read_text())


def write_manifest(sweep: Path, data: Any) -> None:
    (sweep / MANIFEST).write_text(json.dumps(data))


def edit_entry(sweep: Path, executor: str | None = None, **fields: Any) -> None:
    """Change entry 0 (and the executor: the template's is local)."""
    data = manifest_data(sweep)
    data["executor"] = executor or data["executor"]
    data["entries"][0].update(fields)
    write_manifest(sweep, data)


# --- 1. the directory given is the sweep directory ------------------------------------------------------


def test_status_of_a_copy_writes_the_copy_not_the_original(sweep, capsys):
    shutil.copytree(sweep, sweep.with_name("s1copy"))
    before = (sweep / MANIFEST).read_bytes()
    code, _, _ = run_cli(capsys, "status", sweep.with_name("s1copy"))
    assert code == 0
    assert (sweep / MANIFEST).read_bytes() == before
    assert manifest_data(sweep.with_name("s1copy"))["sweep_dir"] == str(sweep.with_name("s1copy"))


def test_a_moved_sweep_keeps_working_and_its_old_place_stays_empty(tmp_path, capsys):
    sweep = tmp_path / "s3"
    assert run_cli(capsys, "submit", TEMPLATE, "--dry-run", "--sweep_dir", sweep)[0] == 0
    moved = sweep.with_name("moved")
    sweep.rename(moved)
    for command in ("status", "resume"):
        code, _, err = run_cli(capsys, command, moved)
        assert code == 0, err
    assert not sweep.exists()


def test_a_hand_set_sweep_dir_field_is_not_followed(sweep, capsys):
    victim = sweep.with_name("victim")
    data = manifest_data(sweep)
    data["sweep_dir"] = str(victim)
    write_manifest(sweep, data)
    for command in ("status", "resume"):
        assert run_cli(capsys, command, sweep)[0] == 0
    assert not victim.exists()


# --- 2. a malformed manifest is exit 2 naming the file and key -------------------------------------------


def _mutate(data: dict[str, Any], how: str) -> Any:
    entry = data["entries"][0]
    mutations = {
        "entries_int": lambda: {**data, "entries": [1]},
        "entries_str": lambda: {**data, "entries": "x"},
        "entry_extra_key": lambda: {**data, "entries": [{**entry, "evil": 1}]},
        "top_extra_key": lambda: {**data, "evil": 1},
        "top_list": lambda: [data],
        "entries_missing": lambda: {k: v for k, v in data.items() if k != "entries"},
        "state_list": lambda: {**data, "entries": [{**entry, "state": ["RUNNING"]}]},
        "state_unknown": lambda: {**data, "entries": [{**entry, "state": "HACKED"}]},
        "index_bool": lambda: {**data, "entries": [{**entry, "index": False}]},
        "index_wrong": lambda: {**data, "entries": [{**entry, "index": 7}]},
        "executor_odd": lambda: {**data, "executor": "ssh"},
        "arrays_bad": lambda: {**data, "arrays": [{"job_id": "../1", "indices": [0]}]},
    }
    return mutations[how]()


@pytest.mark.parametrize(
    "how",
    [
        "entries_int",
        "entries_str",
        "entry_extra_key",
        "top_extra_key",
        "top_list",
        "entries_missing",
        "state_list",
        "state_unknown",
        "index_bool",
        "index_wrong",
        "executor_odd",
        "arrays_bad",
    ],
)
@pytest.mark.parametrize("command", ["status", "resume"])
def test_a_malformed_manifest_is_exit_2_naming_the_file(sweep, capsys, how, command):
    write_manifest(sweep, _mutate(manifest_data(sweep), how))
    code, _, err = run_cli(capsys, command, sweep)
    assert code == 2, err
    assert str(sweep / MANIFEST) in err and "Traceback" not in err


def test_a_manifest_that_is_not_utf8_is_exit_2(sweep, capsys):
    (sweep / MANIFEST).write_bytes(b'{"name": "\xff\xfe"}')
    code, _, err = run_cli(capsys, "status", sweep)
    assert code == 2 and "UTF-8" in err and MANIFEST in err


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False),
        st.text(max_size=12),
        st.sampled_from(["RUNNING", "local:1_0", "12_3", "../x", "slurm", "local", ""]),
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=6,
    )


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place inside a JSON value (dict keys and list positions), the root included."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _apply(data: Any, where: tuple, action: str, value: Any) -> Any:
    if not where:
        return value
    parent = data
    for step in where[:-1]:
        parent = parent[step]
    last = where[-1]
    if action == "delete":
        del parent[last]
    elif action == "add" and isinstance(parent, dict):
        parent[f"{last}_extra"] = value
    else:
        parent[last] = value
    return data


@pytest.mark.heavy
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_mutation_of_a_manifest_loads_or_is_a_config_error_naming_the_file(dry_sweep, data):
    base = json.loads((dry_sweep / MANIFEST).read_text())
    base["entries"][0].update(job_id="123_0", attempts=["122_0"], reason="x", state="FAILED")
    base["executor"] = data.draw(st.sampled_from(["slurm", "local"]))
    if base["executor"] == "local":
        base["entries"][0].update(job_id="local:42_0", attempts=[])
    mutated = copy.deepcopy(base)
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from(_paths(mutated)))
        action = data.draw(st.sampled_from(["replace", "delete", "add"] if where else ["replace"]))
        mutated = _apply(mutated, where, action, data.draw(_json_values()))
    try:
        manifest = manifest_from_json(mutated, "the/manifest.json")
    except ConfigError as err:
        assert all(p.file == "the/manifest.json" for p in err.problems)
        return
    for entry in manifest.entries:  # what loads is safe to use: job ids are file names
        assert entry.job_id is None or "/" not in entry.job_id and ".." not in entry.job_id
        hash(entry.state)


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=200))
def test_any_bytes_as_a_manifest_load_or_are_a_config_error(tmp_path_factory, raw):
    folder = tmp_path_factory.mktemp("raw")
    (folder / MANIFEST).write_bytes(raw)
    try:
        load_manifest(folder)
    except ConfigError as err:
        assert err.problems[0].file == str(folder / MANIFEST)


# --- 3. special files never hang or fill memory -----------------------------------------------------------


@pytest.mark.timeout(120)  # a hang (a FIFO never opened) would be forever
def test_a_fifo_manifest_is_exit_2(sweep, capsys):
    (sweep / MANIFEST).unlink()
    os.mkfifo(sweep / MANIFEST)
    code, _, err = run_cli(capsys, "status", sweep)
    assert code == 2 and "not a regular file" in err


@pytest.mark.timeout(120)  # a hang (a FIFO never opened) would be forever
def test_a_fifo_config_path_does_not_hang_resume(sweep, capsys):
    fifo = Path(load_manifest(sweep).entries[0].config_path)  # where this dry run's config is
    fifo.unlink()
    os.mkfifo(fifo)
    edit_entry(sweep, state="FAILED")
    code, _, err = run_cli(capsys, "resume", sweep)
    assert code == 2 and "not a regular file" in err


@pytest.mark.timeout(120)  # a hang (a FIFO never opened) would be forever
@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_special_result_file_does_not_hang_status(sweep, capsys, kind, monkeypatch):
    monkeypatch.setenv("PATH", str(sweep))  # no sacct/squeue/scontrol: states from result files
    edit_entry(sweep, "slurm", job_id="123_0", state="FAILED")
    result = slurm.result_path(sweep / "slurm", "123_0")
    result.parent.mkdir(exist_ok=True)
    if kind == "fifo":
        os.mkfifo(result)
    else:
        result.symlink_to("/dev/zero")
    assert slurm.read_result(result) is None
    code, _, err = run_cli(capsys, "status", sweep)
    assert code == 0, err


# --- 4. job ids are checked before they become file names -------------------------------------------------


@pytest.mark.parametrize("job_id", ["../../trav/x", "1/../../x", "12_3\n", "local:1_0", "١٢"])
def test_a_job_id_that_is_not_slurms_is_exit_2(sweep, capsys, job_id):
    trav = sweep.parent / "trav"
    trav.mkdir()
    (trav / "x_0_result.pkl").write_bytes(b"")
    edit_entry(sweep, "slurm", job_id=job_id, state="FAILED")
    code, _, err = run_cli(capsys, "status", sweep)
    assert code == 2 and "entries[0].job_id" in err


def test_a_local_job_id_must_be_the_local_form(sweep, capsys):
    data = manifest_data(sweep)
    data["executor"] = "local"
    data["entries"][0].update(job_id="123_0", state="RUNNING")
    write_manifest(sweep, data)
    code, _, err = run_cli(capsys, "status", sweep)
    assert code == 2 and "entries[0].job_id" in err


# --- 5. cancel signals only the element's own process group -----------------------------------------------


def _local_running(sweep: Path, record: bytes) -> None:
    data = manifest_data(sweep)
    data["executor"] = "local"
    data["entries"][0].update(job_id=f"local:{os.getpid()}_0", state="RUNNING")
    write_manifest(sweep, data)
    (sweep / "local").mkdir(exist_ok=True)
    (sweep / "local" / "0.json").write_bytes(record)


def _signals_sent(monkeypatch) -> list[tuple[str, int, int]]:
    """Every os.kill / os.killpg of this process from now on, as (call, target, signal); still sent."""
    sent: list[tuple[str, int, int]] = []
    for name in ("kill", "killpg"):
        real = getattr(os, name)

        def spy(target: int, sig: int, _name: str = name, _real=real) -> None:
            sent.append((_name, target, sig))
            _real(target, sig)

        monkeypatch.setattr(os, name, spy)
    return sent


def test_cancel_leaves_an_unrelated_process_group_alone(sweep, capsys, monkeypatch):
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        _local_running(sweep, json.dumps({"state": "RUNNING", "pgid": other.pid}).encode())
        sent = _signals_sent(monkeypatch)
        code, _, err = run_cli(capsys, "cancel", sweep, 0)
        assert code == 0 and "left alone" in err
        # a signal is sent before cancel returns or never: none went to the group, so none can arrive later
        assert not [s for s in sent if s[1] == other.pid and s[2] != 0], sent
        assert other.poll() is None
        assert json.loads((sweep / "local" / "0.json").read_text())["state"] == "RUNNING"
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()


def test_cancel_signals_a_group_whose_leader_is_the_element(sweep, tmp_path, capsys):
    """A stand-in rank 0 with the element's command line (`-m hpcrl.launcher.element CONFIG RUN_DIR`,
    a module that sleeps) is stopped; the same group with another command line is not (above)."""
    fake = tmp_path / "fake" / "hpcrl" / "launcher"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "element.py").write_text("import time\ntime.sleep(300)\n")
    entry = load_manifest(sweep).entries[0]
    argv = [sys.executable, "-m", "hpcrl.launcher.element", entry.config_path, entry.run_dir]
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake")}
    leader = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        wait_until(
            lambda: local.runs_element(leader.pid, entry.config_path, entry.run_dir),
            120,
            "the stand-in's /proc cmdline to show the element module",
        )
        assert not local.runs_element(leader.pid, entry.config_path, "/elsewhere")
        _local_running(sweep, json.dumps({"state": "RUNNING", "pgid": leader.pid}).encode())
        code, _, err = run_cli(capsys, "cancel", sweep, 0)
        assert code == 0 and "left alone" not in err
        assert leader.wait(timeout=120) == -signal.SIGTERM
    finally:
        leader.kill()
        leader.wait()


@pytest.mark.parametrize(
    "record", [b"[1]", b"\xff\xfe", b'{"state": "RUNNING", "pgid": "x"}', b'{"pgid": 0}']
)
def test_a_malformed_local_state_file_is_exit_2(sweep, capsys, record):
    _local_running(sweep, record)
    code, _, err = run_cli(capsys, "cancel", sweep)
    assert code == 2 and "0.json" in err and "Traceback" not in err


# --- 6. resume checks its overrides whatever the sweep's state --------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        ["--cluster.cpus_per_task", "-5"],
        ["--cluster.cpus_per_task", str(10**30)],
        ["--cluster.env", "{PATH: /tmp/evil}"],
        ["--dpo.beta", "0.5"],  # another stage's section (the sweep's elements are stage rl)
    ],
)
def test_resume_checks_overrides_when_nothing_is_resumed(sweep, capsys, value):
    code, out, err = run_cli(capsys, "resume", sweep, *value)
    assert code == 2 and value[0][2:] in err and "nothing to resume" not in out


def test_resume_with_good_overrides_and_nothing_to_resume_is_exit_0(sweep, capsys):
    code, out, _ = run_cli(capsys, "resume", sweep, "--cluster.cpus_per_task", "2")
    assert code == 0 and "nothing to resume" in out


@pytest.mark.timeout(120)  # a hang (a FIFO never opened) would be forever
def test_a_fifo_log_is_named_not_read(sweep, capsys):
    edit_entry(sweep, job_id="local:5_0", state="FAILED")
    (sweep / "local").mkdir(exist_ok=True)
    os.mkfifo(sweep / "local" / "0.log")
    code, out, _ = run_cli(capsys, "logs", sweep, 0)
    assert code == 0 and "not a regular file" in out


def test_logs_show_a_job_s_control_characters_escaped_and_each_line_as_it_last_read(sweep, capsys):
    """A job's output is data to the reader: an escape sequence (clear screen, retitle the terminal, hide
    text) prints escaped instead of driving the terminal; a progress bar's redraws show their last state."""
    edit_entry(sweep, job_id="local:5_0", state="FAILED")
    (sweep / "local").mkdir(exist_ok=True)
    hostile = "step 1\rstep 2\rstep 3/3\n\x1b[2J\x1b]0;pwned\x07bell\x00nul\x9bcsi\ttab\r\nend\n"
    (sweep / "local" / "0.log").write_bytes(hostile.encode())
    code, out, _ = run_cli(capsys, "logs", sweep, 0)
    assert code == 0
    shown = out.split("<==\n", 1)[1]
    assert shown.splitlines() == [
        "step 3/3",
        "\\x1b[2J\\x1b]0;pwned\\x07bell\\x00nul\\x9bcsi\\ttab",
        "end",
        "",
    ]
    assert not any(ord(c) < 32 and c != "\n" or 127 <= ord(c) < 160 for c in out)


# --- 7. output directories: never through a symlink, never someone else's folder (hpcrl.config.output_dirs)


@pytest.fixture
def planted(tmp_path) -> tuple[Path, Path]:
    """A link planted where a user will type a path (the README's /tmp/demo), to a victim directory
    (standing in for /etc: this suite runs as root)."""
    victim = tmp_path / "etc"
    victim.mkdir()
    (victim / "passwd").write_text("root:x:0:0\n")
    (tmp_path / "demo").symlink_to(victim)
    return tmp_path / "demo", victim


@pytest.mark.parametrize("tail", ["", "sweep"])
def test_a_sweep_dir_through_a_symlink_is_exit_2_and_writes_nothing_there(planted, capsys, tail):
    """Was: configs/, sbatch/ and manifest.json written into the link's target."""
    link, victim = planted
    code, _, err = run_cli(
        capsys, "submit", TEMPLATE, "--dry-run", "--sweep_dir", link / tail if tail else link
    )
    assert code == 2 and "--sweep_dir: " in err and "symbolic link" in err and "Traceback" not in err
    assert sorted(p.name for p in victim.iterdir()) == ["passwd"]


def test_a_foreign_non_empty_folder_is_not_a_sweep_dir(tmp_path, capsys):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(b"\xff\xd8")
    code, _, err = run_cli(capsys, "submit", TEMPLATE, "--dry-run", "--sweep_dir", folder)
    assert code == 2 and "--sweep_dir: is a non-empty folder that is not a sweep directory" in err
    assert sorted(p.name for p in folder.iterdir()) == ["cat.jpg"]


def test_a_dry_run_sweep_dir_may_be_reused(sweep, capsys):
    assert run_cli(capsys, "submit", TEMPLATE, "--dry-run", "--sweep_dir", sweep)[0] == 0


@pytest.mark.parametrize("where", ["link", "folder"])
def test_a_run_root_through_a_symlink_or_in_a_folder_of_files_is_exit_2(planted, tmp_path, capsys, where):
    """`hpcrl run T --run_root /etc` made /etc/<name>/<id>/ and wrote the run there."""
    link, victim = planted
    root = link if where == "link" else victim
    code, _, err = run_cli(capsys, "run", TEMPLATE, "--run_root", root)
    assert code == 2 and ":run_root: " in err and "Traceback" not in err
    assert sorted(p.name for p in victim.iterdir()) == ["passwd"]


PROBE = "entrypoint: hpcrl.launcher.probe:main\nname: probe\n"


@pytest.mark.heavy
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_hostile_sweep_dir_is_refused_in_one_line_or_written_only_where_it_leads(tmp_path, capsys, data):
    sandbox = Sandbox.make(tmp_path / "sandbox")
    path = data.draw(hostile_paths(sandbox))
    before = sandbox.listing()
    code, _, err = run_cli(capsys, "submit", TEMPLATE, "--dry-run", "--sweep_dir", path)
    sandbox.check(path, code, err, "--sweep_dir", before)


@pytest.mark.heavy
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_hostile_run_root_is_refused_in_one_line_or_written_only_where_it_leads(tmp_path, capsys, data):
    """`hpcrl run` of the probe entrypoint (one rank, in this process): its run directory is the one
    written under the run root."""
    sandbox = Sandbox.make(tmp_path / "sandbox")
    template = tmp_path / "probe.yaml"
    template.write_text(PROBE)
    path = data.draw(hostile_paths(sandbox))
    before = sandbox.listing()
    code, _, err = run_cli(capsys, "run", template, "--run_root", path)
    sandbox.check(path, code, err, "run_root", before)


# --- 8. what a terminal is shown of a manifest is escaped ----------------------------------------------


def test_status_escapes_control_characters_of_every_cell(sweep, capsys):
    """A manifest's swept values went to the terminal raw, ESC sequences included (terminal injection)."""
    data = manifest_data(sweep)
    data["keys"] = ["seed\x1b[2J"]
    data["name"] = "n\x1b]0;title\x07"
    data["entries"][0].update(swept={"seed\x1b[2J": "\x1b[31mred\nforged line"}, reason="r\x1b[5m")
    write_manifest(sweep, data)
    code, out, err = run_cli(capsys, "status", sweep)
    assert code == 0, err
    assert "\x1b" not in out + err and "\x07" not in out
    assert "\\x1b[31mred\\nforged line" in out and "forged line" not in out.replace("\\nforged line", "")


def test_a_parser_error_is_one_line_without_a_literal_newline(sweep, capsys):
    code, _, err = run_cli(capsys, "logs", sweep, "x")
    assert code == 2 and err.count("\n") == 1 and "\\n" not in err and 'key "index"' in err


# --- 9. a local element without its state record ------------------------------------------------------


def _gone_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(
    ("state", "expected"), [("FAILED", "FAILED"), ("RUNNING", "LOST"), ("UNKNOWN", "LOST")]
)
def test_a_local_element_whose_state_file_is_gone_keeps_its_end_or_is_lost(sweep, capsys, state, expected):
    """Was UNKNOWN (a FAILED element included), which `resume` skipped; the README says such an element
    is LOST and run again."""
    edit_entry(sweep, "local", job_id=f"local:{_gone_pid()}_0", state=state, reason="RuntimeError: boom")
    assert not (sweep / "local" / "0.json").exists()
    code, _, err = run_cli(capsys, "status", sweep, "--json")
    assert code == 0, err
    manifest = load_manifest(sweep)
    assert manifest.entries[0].state == expected
    assert [e.index for e in sweeps.resubmittable(manifest)] == [0]


# --- 10. a manifest's config_path is the element's config, read in the sweep ------------------------------


@pytest.mark.parametrize("kind", ["etc_passwd", "fifo", "huge", "outside_configs"])
@pytest.mark.parametrize("command", ["status", "resume"])
def test_a_config_path_that_is_not_the_elements_config_is_refused_naming_the_entry(
    sweep, tmp_path, capsys, kind, command
):
    """Was refused only after /etc/passwd had been read and fingerprinted, and reported as
    `run_root: ... choose another run_root`."""
    special = {"etc_passwd": Path("/etc/passwd"), "outside_configs": tmp_path / "configs" / "x.yaml"}
    if kind == "fifo":
        special[kind] = tmp_path / "fifo"
        os.mkfifo(special[kind])
    elif kind == "huge":
        special[kind] = tmp_path / "huge.yaml"
        with special[kind].open("wb") as fh:
            fh.truncate(20 << 20)
    edit_entry(sweep, config_path=str(special[kind]), state="FAILED")
    code, _, err = run_cli(capsys, command, sweep)
    assert code == 2 and f"{sweep / MANIFEST}:entries[0].config_path: " in err and "run_root" not in err, err


def test_a_moved_dry_run_reads_its_configs_in_its_new_place(sweep, capsys):
    moved = sweep.with_name("moved")
    sweep.rename(moved)
    [entry] = load_manifest(moved).entries
    assert Path(entry.config_path).parent == moved / "configs" and Path(entry.config_path).is_file()
