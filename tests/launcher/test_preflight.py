"""Preflight and status without accounting, pure parts: scontrol's records, Slurm durations and GRES,
the fit of a resource shape to a cluster (the A100-shaped cluster's own answers, kept in golden/),
CPUs derived from the node, element states from squeue / scontrol / submitit's result files, and the
run dir's config.yaml checked against the manifest's fingerprint. The live-cluster half is
test_a100_cluster.py."""

from __future__ import annotations

import dataclasses
import os
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl import cli
from hpcrl.cluster.config import ClusterConfig
from hpcrl.errors import ClusterError, ConfigError, Problem
from hpcrl.experiment.resolve import resolve
from hpcrl.launcher import cluster_view, preflight, slurm, sweeps
from hpcrl.launcher.sweep_manifest import load_manifest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
GPU_TEMPLATES = sorted((REPO / "templates" / "gpu").glob("*.yaml"))


def a100_view(**changes) -> cluster_view.ClusterView:
    view = cluster_view.view_from_text(
        "MaxArraySize            = 1001\n",
        (GOLDEN / "a100-partitions.txt").read_text(),
        (GOLDEN / "a100-nodes.txt").read_text(),
    )
    return dataclasses.replace(view, **changes)


def a100_cluster(**changes) -> ClusterConfig:
    """The a100-ib profile's request as a GPU template resolves it (8 ranks, gpu:a100:8, 900 GB)."""
    cluster = resolve(GPU_TEMPLATES[0]).elements[0].config.cluster
    return dataclasses.replace(cluster, **changes)


# --- parsing ----------------------------------------------------------------------------------------------

_KEYS = st.text(string.ascii_letters, min_size=1, max_size=1).flatmap(
    lambda first: st.text(string.ascii_letters + string.digits + "_:", max_size=12).map(
        lambda rest: first + rest
    )
)
_WORD = st.text(string.ascii_letters + string.digits + "[]()@,.-+*/#", min_size=1, max_size=10)


@given(st.dictionaries(_KEYS, st.lists(_WORD, max_size=4).map(" ".join), max_size=12))
def test_scontrol_records_round_trip_values_with_spaces(record):
    """Any record that scontrol could print (values with spaces and no ` Key=` inside) reads back."""
    line = " ".join(f"{key}={value}" for key, value in record.items())
    assert slurm.parse_record(line) == record


def test_the_a100_clusters_own_answers_parse():
    view = a100_view()
    assert view.default_partition == "gpu" and view.max_array_size == 1001
    gpu = view.partitions["gpu"]
    assert gpu.max_time_s == 2 * 86400 and gpu.max_nodes is None and gpu.max_mem_per_node_mb is None
    assert [n.name for n in view.nodes] == ["node1", "node2"]
    node = view.nodes[0]
    assert (node.cpus, node.memory_mb, node.features, node.partitions) == (
        64,
        1_000_000,
        frozenset({"a100", "ib"}),
        frozenset({"gpu"}),
    )
    assert node.gres == {"gpu": 8, "gpu:a100": 8}
    assert slurm.parse_record("NodeName=n1 OS=Linux 6.1 #1 SMP  RealMemory=5")["OS"] == "Linux 6.1 #1 SMP"


@given(st.integers(0, 400 * 86400))
def test_every_slurm_duration_form_reads_back(seconds):
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    assert cluster_view.parse_time_s(f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}") == seconds
    assert cluster_view.parse_time_s(f"{days * 24 + hours}:{minutes:02d}:{secs:02d}") == seconds
    assert cluster_view.parse_time_s(f"{seconds // 60}:{secs:02d}") == seconds
    assert cluster_view.parse_time_s(f"{seconds // 60}") == seconds - secs
    assert cluster_view.parse_time_s(f"{days}-{hours}") == (days * 24 + hours) * 3600
    assert cluster_view.parse_time_s(cluster_view.format_minutes(seconds)) == seconds


def test_unlimited_durations_and_garbage():
    assert cluster_view.parse_time_s("UNLIMITED") is None and cluster_view.parse_time_s("INFINITE") is None
    with pytest.raises(ValueError):
        cluster_view.parse_time_s("1:2:3:4")


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("gpu:a100:8(S:0-1)", {"gpu": 8, "gpu:a100": 8}),
        ("gpu:2,nic:1", {"gpu": 2, "nic": 1}),
        ("gpu:a100:4(S:0),gpu:v100:2(S:1)", {"gpu": 6, "gpu:a100": 4, "gpu:v100": 2}),
        ("gpu", {"gpu": 1}),
        ("(null)", {}),
        ("gpu:a100:8:x", None),  # not a form read here: sbatch --test-only judges it
    ],
)
def test_gres_lists(text, counts):
    assert cluster_view.parse_gres(text) == counts


@pytest.mark.parametrize(
    ("constraint", "verdict"),
    [("a100&ib", True), ("a100,ib", True), ("h100|a100", True), ("h100&ib", False), ("[a100|h100]", None)],
)
def test_plain_constraints_are_judged_and_others_left_to_sbatch(constraint, verdict):
    assert cluster_view.constraint_ok(constraint, frozenset({"a100", "ib"})) is verdict


# --- the fit of one resource shape -----------------------------------------------------------------------


@pytest.mark.parametrize("template", GPU_TEMPLATES, ids=lambda p: p.name)
def test_gpu_templates_fit_the_a100_cluster_with_8_cpus_per_rank(template):
    """The a100-ib profile asked 8 x 12 = 96 CPUs of 64-CPU nodes; unset, it gets the node's 64 / 8."""
    cluster = resolve(template).elements[0].config.cluster
    assert cluster.cpus_per_task is None
    assert preflight.fit(cluster, a100_view()) == preflight.Fit(8, [])
    old = preflight.fit(dataclasses.replace(cluster, cpus_per_task=12), a100_view())
    assert [p.key for p in old.problems] == ["cluster.cpus_per_task"]
    assert (
        "8 tasks x 12 CPUs = 96 CPUs per node, but partition gpu's nodes have at most 64"
        in old.problems[0].message
    )


def test_every_oversized_request_is_one_problem_naming_its_key():
    cluster = a100_cluster(cpus_per_task=100, time_min=3000, mem_gb=2000.0, gres="gpu:a100:9", nodes=3)
    cluster = dataclasses.replace(cluster, constraint="a100&h100")
    problems = {p.key: p.message for p in preflight.fit(cluster, a100_view()).problems}
    assert sorted(problems) == [
        "cluster.constraint",
        "cluster.cpus_per_task",
        "cluster.gres",
        "cluster.mem_gb",
        "cluster.nodes",
        "cluster.time_min",
    ]
    assert "3000 min is above partition gpu's MaxTime 2-00:00:00 (2880 min)" in problems["cluster.time_min"]
    assert "gpu:a100:9 per node, but partition gpu's nodes have gpu:a100:8" in problems["cluster.gres"]
    assert "3 nodes, but partition gpu has 2" in problems["cluster.nodes"]
    assert all("\n" not in message for message in problems.values())


def test_unknown_or_missing_partition():
    view = a100_view()
    assert preflight.fit(a100_cluster(partition="nope"), view).problems == [
        Problem("no partition 'nope' on this cluster (partitions: gpu)", key="cluster.partition")
    ]
    no_default = dataclasses.replace(
        view, partitions={"gpu": dataclasses.replace(view.partitions["gpu"], default=False)}
    )
    [problem] = preflight.fit(a100_cluster(partition=None), no_default).problems
    assert problem.key == "cluster.partition" and "no default partition" in problem.message


def test_cpus_come_from_the_smallest_node_that_fits_the_rest_of_the_request():
    view = a100_view()
    small = dataclasses.replace(view.nodes[0], name="cpu1", cpus=16, gres={})
    wide = dataclasses.replace(view.nodes[1], name="big1", cpus=128)
    mixed = dataclasses.replace(view, nodes=[small, *view.nodes, wide])
    assert preflight.fit(a100_cluster(), mixed).cpus_per_task == 8  # the GPU nodes only; 64 the smallest
    cpu_job = a100_cluster(gres=None, gpus_per_node=0, tasks_per_node=4, mem_gb=None, constraint=None)
    assert preflight.fit(cpu_job, mixed).cpus_per_task == 4  # 16 / 4
    capped = dataclasses.replace(
        mixed, partitions={"gpu": dataclasses.replace(view.partitions["gpu"], max_cpus_per_node=32)}
    )
    assert preflight.fit(cpu_job, capped).cpus_per_task == 4
    assert preflight.fit(a100_cluster(), capped).cpus_per_task == 4  # MaxCPUsPerNode 32 / 8


def test_two_nodes_that_each_fit_one_request_but_not_all():
    view = a100_view()
    no_ib = dataclasses.replace(view.nodes[0], features=frozenset({"a100"}))
    low_mem = dataclasses.replace(view.nodes[1], memory_mb=100_000)
    [problem] = preflight.fit(a100_cluster(), dataclasses.replace(view, nodes=[no_ib, low_mem])).problems
    assert problem.key == "cluster.nodes"
    assert "1 node(s) asked, but 0 of partition gpu's 2 node(s)" in problem.message


def test_without_a_node_list_the_cpus_are_left_to_slurm_and_said_so():
    view = a100_view(partitions=None, nodes=None, unavailable="scontrol show partition/node failed")
    arrays = slurm.plan_arrays(resolve(GPU_TEMPLATES[0]).elements, "g", 1001)
    fitted, problems, notes = preflight.check_arrays(arrays, view, "g")
    assert problems == [] and "cpus_per_task" not in fitted[0].params
    assert not any(line.startswith("export OMP_NUM_THREADS") for line in fitted[0].params["setup"])
    assert notes == [
        "cluster.cpus_per_task is not set and cannot be derived from the node (no node list: scontrol show "
        "partition/node failed): --cpus-per-task left to Slurm's default (1 CPU per task)"
    ]


def test_problems_shared_by_arrays_name_their_elements_once(tmp_path):
    template = tmp_path / "t.yaml"
    template.write_text(
        f"extends: {GPU_TEMPLATES[0]}\ncluster: {{time_min: 5000}}\n"
        "sweep: {grid: {seed: [0, 1, 2]}, list: [{}, {cluster.mem_gb: 2000}]}\n"
    )
    sweep = resolve(template)
    arrays = slurm.plan_arrays(sweep.elements, sweep.name, limit=2)
    assert len(arrays) == 4  # two shapes, cut at 2
    big = sorted(i for array in arrays if array.cluster.mem_gb == 2000 for i in array.indices)
    _, problems, _ = preflight.check_arrays(arrays, a100_view(), sweep.name, lambda params, n: None)
    text = [str(p) for p in problems]
    assert len(text) == 2, text
    assert text[0].startswith("cluster.time_min: 5000 min")
    assert text[0].endswith("[sweep element(s) 0, 1, 2, 3, 4, 5]")
    assert text[1].startswith("cluster.mem_gb: 2000 GB")
    assert text[1].endswith(f"[sweep element(s) {', '.join(map(str, big))}]")


def test_sbatch_test_only_judges_what_the_model_does_not(tmp_path):
    arrays = slurm.plan_arrays(resolve(GPU_TEMPLATES[0]).elements, "g", 1001)
    seen = []

    def refuse(params, tasks):
        seen.append((params["cpus_per_task"], tasks))
        return "sbatch: error: Batch job submission failed: Invalid qos specification"

    _, [problem], _ = preflight.check_arrays(arrays, a100_view(), "g", refuse)
    assert seen == [(8, 1)]
    assert str(problem) == (
        "cluster: sbatch --test-only refuses the script: sbatch: error: Batch job submission failed: "
        "Invalid qos specification"
    )


def test_omp_threads_follow_the_cpus_unless_the_env_sets_them():
    from hpcrl.launcher.sbatch import sbatch_parameters

    cluster = a100_cluster()
    assert "export OMP_NUM_THREADS=8" in sbatch_parameters(cluster, "g", cpus_per_task=8)["setup"]
    given = dataclasses.replace(cluster, cpus_per_task=6, env={**cluster.env, "OMP_NUM_THREADS": "2"})
    params = sbatch_parameters(given, "g", cpus_per_task=8)
    assert params["cpus_per_task"] == 6 and "export OMP_NUM_THREADS=2" in params["setup"]


def test_a_dry_run_without_a_controller_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol / sbatch here
    args = ["submit", str(GPU_TEMPLATES[0]), "--dry-run", "--sweep_dir", str(tmp_path / "sw")]
    assert cli.main([*args, "--run_root", str(tmp_path / "runs")]) == 0
    out, err = capsys.readouterr()
    notes = [line for line in err.splitlines() if line.startswith("hpcrl: note:")]
    assert notes[0].startswith("hpcrl: note: no Slurm controller answered (`scontrol` is not on PATH")
    assert "#SBATCH --cpus-per-task" not in out and "#SBATCH --gres=gpu:a100:8" in out
    code = cli.main(["submit", str(GPU_TEMPLATES[0]), "--sweep_dir", str(tmp_path / "sw2")])
    assert code == 1 and "cluster error: `scontrol` is not on PATH" in capsys.readouterr().err
    assert not (tmp_path / "sw2").exists()


# --- states without accounting ---------------------------------------------------------------------------


def test_squeue_sacct_and_scontrol_rows():
    rows = slurm.parse_rows(
        "12_[3-4]|PENDING|PartitionTimeLimit\n12_0|FAILED|None|1:0\n12_1|CANCELLED by 0||0:0\n"
    )
    assert rows == {
        "12_3": slurm.Observed("PENDING", "PartitionTimeLimit"),
        "12_4": slurm.Observed("PENDING", "PartitionTimeLimit"),
        "12_0": slurm.Observed("FAILED", "exit 1:0"),
        "12_1": slurm.Observed("CANCELLED"),
    }
    text = (
        "JobId=14 ArrayJobId=12 ArrayTaskId=1 JobName=x JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0 "
        "RunTime=00:00:01\nJobId=12 ArrayJobId=12 ArrayTaskId=5-6 JobState=PENDING Reason=Resources "
        "ExitCode=0:0\nJobId=20 JobName=y JobState=COMPLETED Reason=None ExitCode=0:0\n"
    )
    assert slurm.parse_scontrol_jobs(text) == {
        "12_1": slurm.Observed("FAILED", "NonZeroExitCode (exit 1:0)"),
        "12_5": slurm.Observed("PENDING", "Resources"),
        "12_6": slurm.Observed("PENDING", "Resources"),
        "20": slurm.Observed("COMPLETED"),
    }


class _Loud:
    """Unpickling it would run os.system: reading a result file must never unpickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_result_files_are_read_without_unpickling(tmp_path):
    from submitit.core.utils import cloudpickle_dump

    try:
        raise ValueError("probe: seed 2 fails\nsecond line of the message")
    except ValueError:
        import traceback

        text = traceback.format_exc()
    cloudpickle_dump(("error", text), tmp_path / "7_1_0_result.pkl")
    cloudpickle_dump(("success", {"x": _Loud(tmp_path / "RAN")}), tmp_path / "7_2_0_result.pkl")
    (tmp_path / "7_3_0_result.pkl").write_bytes(b"\x80\x05garbage")
    assert slurm.read_result(slurm.result_path(tmp_path, "7_1")) == slurm.Observed(
        "FAILED", "ValueError: probe: seed 2 fails"
    )
    assert slurm.read_result(slurm.result_path(tmp_path, "7_2")) == slurm.Observed("COMPLETED")
    assert slurm.read_result(slurm.result_path(tmp_path, "7_3")) is None
    assert slurm.read_result(slurm.result_path(tmp_path, "7_4")) is None
    assert not (tmp_path / "RAN").exists()


def fake_cluster(monkeypatch, answers: dict[str, str | Exception]) -> list[str]:
    """slurm._run answering by command name; returns the commands asked, in order."""
    asked = []

    def run(cmd, timeout=60):
        asked.append(" ".join(cmd[:3]))
        answer = answers.get(cmd[0]) if cmd[0] != "scontrol" else answers.get(f"scontrol {cmd[-1]}")
        if isinstance(answer, Exception) or answer is None:
            raise answer or ClusterError(
                f"`{cmd[0]}` failed (exit 1): slurm_load_jobs error: Invalid job id specified"
            )
        return answer

    monkeypatch.setattr(slurm, "_run", run)
    return asked


def test_without_accounting_no_state_goes_stale(tmp_path, monkeypatch):
    from submitit.core.utils import cloudpickle_dump

    cloudpickle_dump(("success", 1), tmp_path / "30_2_0_result.pkl")
    cloudpickle_dump(("error", "Traceback ...\n  File x\nRuntimeError: boom"), tmp_path / "30_3_0_result.pkl")
    no_accounting = ClusterError("`sacct` failed (exit 1): Slurm accounting storage is disabled")
    asked = fake_cluster(
        monkeypatch,
        {
            "sacct": no_accounting,
            "squeue": "30_0|RUNNING|None\n",
            "scontrol 30": "JobId=31 ArrayJobId=30 ArrayTaskId=1 JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15\n"
            "JobId=33 ArrayJobId=30 ArrayTaskId=3 JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0\n",
        },
    )
    ids = ["30_0", "30_1", "30_2", "30_3", "30_4"]
    states, note = slurm.element_states(tmp_path, ids)
    assert states == {
        "30_0": slurm.Observed("RUNNING"),
        "30_1": slurm.Observed("TIMEOUT", "TimeLimit (exit 0:15)"),
        "30_2": slurm.Observed("COMPLETED"),  # the controller forgot it; its result file did not
        "30_3": slurm.Observed("FAILED", "RuntimeError: boom"),  # the exception says more than Slurm
        "30_4": slurm.Observed("LOST", "ended without a result file; no longer known to squeue or scontrol"),
    }
    assert note.startswith("no accounting (sacct: Slurm accounting storage is disabled): states from squeue")
    assert asked == ["sacct -X -P", "squeue -h -r", "scontrol show job"]
    # the controller down as well: the result files still speak, and nothing is called LOST
    fake_cluster(monkeypatch, {"sacct": no_accounting, "squeue": ClusterError("`squeue` failed: timeout")})
    states, _ = slurm.element_states(tmp_path, ids)
    assert states == {
        "30_2": slurm.Observed("COMPLETED"),
        "30_3": slurm.Observed("FAILED", "RuntimeError: boom"),
    }


# --- a run dir's config.yaml against the manifest's fingerprint ------------------------------------------


def test_a_run_dirs_config_is_reused_only_when_it_is_the_one_the_manifest_fingerprints(tmp_path, capsys):
    template = tmp_path / "t.yaml"
    template.write_text(f"extends: {REPO / 'templates/base.yaml'}\nname: fp\nrun_root: {tmp_path / 'runs'}\n")
    element = resolve(template).elements[0]
    path = sweeps.write_config(element)
    assert sweeps.write_config(element) == path  # the same file again: kept
    path.write_text(path.read_text().replace("seed: 0", "seed:   0"))  # same config, other bytes: kept
    sweeps.write_config(element)
    other = tmp_path / "other.yaml"
    other.write_text(path.read_text())
    path.unlink()
    path.symlink_to(other)
    with pytest.raises(ConfigError, match=r"config\.yaml:run_root: is a symlink \(to .*other\.yaml\)"):
        sweeps.write_config(element)
    assert cli.main(["run", str(template)]) == 2
    assert "is a symlink" in capsys.readouterr().err
    path.unlink()
    path.write_text(other.read_text().replace("seed:   0", "seed: 1"))
    with pytest.raises(ConfigError, match=f"holds config [0-9a-f]+, not {element.config_id}"):
        sweeps.write_config(element)


def test_submit_refuses_every_foreign_config_before_the_manifest(tmp_path, capsys):
    template = tmp_path / "t.yaml"
    template.write_text(
        f"extends: {REPO / 'templates/base.yaml'}\nname: fp2\nrun_root: {tmp_path / 'runs'}\n"
        "cluster: {executor: local}\nsweep: {grid: {seed: [0, 1, 2]}}\n"
    )
    for element in resolve(template).elements[:2]:
        element.run_dir.mkdir(parents=True)
        (element.run_dir / "config.yaml").symlink_to("/etc/hostname")
    code = cli.main(["submit", str(template), "--sweep_dir", str(tmp_path / "sw")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("is a symlink (to /etc/hostname)") == 2, err
    assert not (tmp_path / "sw" / "manifest.json").exists()


def test_resume_takes_cluster_keys_only(tmp_path, capsys):
    template = tmp_path / "t.yaml"
    template.write_text(f"extends: {REPO / 'templates/base.yaml'}\nname: r\nrun_root: {tmp_path / 'runs'}\n")
    assert cli.main(["submit", str(template), "--dry-run", "--sweep_dir", str(tmp_path / "sw")]) == 0
    capsys.readouterr()
    code = cli.main(["resume", str(tmp_path / "sw"), "--optim.lr", "1", "--cluster.profile", "a100-ib"])
    err = capsys.readouterr().err
    assert code == 2
    assert "command line:optim.lr: resume changes only cluster.* keys" in err
    assert "command line:cluster.profile: resume cannot change it" in err
    assert load_manifest(tmp_path / "sw").arrays == []


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 256), st.integers(1, 64), st.integers(1, 16))
def test_derived_cpus_always_fit_and_use_the_node(node_cpus, tasks, nodes):
    view = a100_view()
    sized = dataclasses.replace(view, nodes=[dataclasses.replace(n, cpus=node_cpus) for n in view.nodes])
    cluster = ClusterConfig(executor="slurm", partition="gpu", nodes=min(nodes, 2), tasks_per_node=tasks)
    result = preflight.fit(cluster, sized)
    if tasks > node_cpus:
        assert [p.key for p in result.problems] == ["cluster.tasks_per_node"] and result.cpus_per_task is None
    else:
        assert result.problems == [] and result.cpus_per_task == node_cpus // tasks
        assert tasks * result.cpus_per_task <= node_cpus < tasks * (result.cpus_per_task + 1)
