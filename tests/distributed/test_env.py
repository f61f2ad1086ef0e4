"""DistEnv: reading Slurm / torchrun / single-process environments, and forming the group from it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcrl.distributed.env import (
    AGENT_STORE_ENV,
    PORT_BASE,
    PORT_SPAN,
    STORE_FD_ENV,
    DistEnv,
    init_process_group,
    parse_node_addr,
    parse_tasks_per_node,
    port_for_job,
    rendezvous_store,
    resolve_backend,
    scontrol_hostnames,
    scontrol_node_addr,
    tasks_on_node,
)
from hpcrl.errors import ConfigError
from tests.slurm.cluster import REPO_ROOT

# What srun gives task 3 of `sbatch -N2 --ntasks-per-node=2` (seen on the dev cluster).
SLURM_TASK_3 = {
    "SLURM_JOB_ID": "17",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURMD_NODENAME": "node2",
}
ADDRS = {"node1": "10.0.0.1", "node2": "10.0.0.2"}


def fake_hostnames(nodelist: str) -> list[str]:
    assert nodelist == "node[1-2]"
    return ["node1", "node2"]


def read_slurm(environ: dict[str, str]) -> DistEnv:
    return DistEnv.from_environ(environ, hostnames=fake_hostnames, node_addr=ADDRS.__getitem__)


def test_slurm_task_reads_rank_node_and_first_node_address():
    env = read_slurm(SLURM_TASK_3)
    assert env == DistEnv(
        rank=3,
        world_size=4,
        local_rank=1,
        node_rank=1,
        master_addr="10.0.0.1",  # first node's NodeAddr, not its (unresolvable) name
        master_port=PORT_BASE + 17,
        node_name="node2",
        job_id="17",
        local_world_size=2,
        source="slurm",
    )
    assert env.torchrun_environ()["MASTER_ADDR"] == "10.0.0.1"
    assert env.torchrun_environ()["RANK"] == "3"


def test_explicit_master_addr_and_port_win_over_slurm_derivation():
    env = read_slurm({**SLURM_TASK_3, "MASTER_ADDR": "head", "MASTER_PORT": "31000"})
    assert (env.master_addr, env.master_port) == ("head", 31000)


def test_sbatch_batch_script_without_srun_step_is_a_single_process():
    batch = {k: v for k, v in SLURM_TASK_3.items() if not k.startswith("SLURM_STEP")}
    batch.update(SLURM_PROCID="0", SLURM_NODEID="0", SLURM_LOCALID="0")
    env = read_slurm(batch)
    assert (env.rank, env.world_size, env.source, env.job_id) == (0, 1, "single", "17")


def test_torchrun_variables_are_read_and_win_inside_a_slurm_step_when_torchrun_started_us():
    torchrun = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.1.1.1",
        "MASTER_PORT": "29400",
    }
    env = DistEnv.from_environ({**SLURM_TASK_3, **torchrun, "TORCHELASTIC_RUN_ID": "x"})
    assert (env.rank, env.world_size, env.local_rank, env.node_rank, env.local_world_size) == (5, 8, 1, 1, 4)
    assert (env.master_addr, env.master_port, env.source) == ("10.1.1.1", 29400, "torchrun")


def test_no_launcher_is_a_single_process():
    env = DistEnv.from_environ({})
    assert (env.rank, env.world_size, env.local_rank, env.source) == (0, 1, 0, "single")


def test_bad_values_name_the_variable():
    with pytest.raises(ConfigError, match="SLURM_PROCID: must be an integer, got 'x'"):
        read_slurm({**SLURM_TASK_3, "SLURM_PROCID": "x"})
    with pytest.raises(ConfigError, match=r"rank 4 is outside \[0, 4\)"):
        read_slurm({**SLURM_TASK_3, "SLURM_PROCID": "4"})
    with pytest.raises(ConfigError, match="torchrun environment:WORLD_SIZE: must be an integer"):
        DistEnv.from_environ({"RANK": "0", "WORLD_SIZE": ""})
    with pytest.raises(ConfigError, match="SLURM_STEP_TASKS_PER_NODE"):
        read_slurm({**SLURM_TASK_3, "SLURM_STEP_TASKS_PER_NODE": "2(y2)"})


@given(st.lists(st.tuples(st.integers(1, 64), st.integers(1, 50)), min_size=1, max_size=6))
def test_tasks_per_node_expands_slurm_compression(runs):
    text = ",".join(f"{count}(x{times})" if times > 1 else str(count) for count, times in runs)
    expanded = [count for count, times in runs for _ in range(times)]
    assert parse_tasks_per_node(text) == expanded
    assert tasks_on_node(text, len(expanded) - 1) == expanded[-1]


@given(st.integers(1, 10**9), st.integers(0, 10**4))
def test_job_port_is_in_range_and_consecutive_jobs_differ(job_id, array_task):
    port = port_for_job(str(job_id))
    assert PORT_BASE <= port < PORT_BASE + PORT_SPAN
    assert port_for_job(str(job_id + 1)) != port
    assert PORT_BASE <= port_for_job(f"{job_id}_{array_task}") < PORT_BASE + PORT_SPAN


def test_job_port_of_non_numeric_id_is_stable_and_in_range():
    assert port_for_job("abc") == port_for_job("abc")
    assert PORT_BASE <= port_for_job("abc") < PORT_BASE + PORT_SPAN


def test_node_addr_is_parsed_from_scontrol_show_node():
    text = "NodeName=node3 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=localhost Port=16823"
    assert parse_node_addr(text) == "127.0.0.1"
    assert parse_node_addr("NodeName=node3 State=IDLE") is None


def test_single_process_group_needs_no_port():
    import torch.distributed as dist

    group = init_process_group(DistEnv.from_environ({}), backend="auto", timeout_s=120)
    try:
        assert resolve_backend("auto") == "gloo"  # this CPU machine
        assert dist.get_world_size(group) == 1
    finally:
        dist.destroy_process_group()


@pytest.mark.heavy
@pytest.mark.dist
def test_two_torchrun_style_processes_form_a_group_at_the_store_rank_0_hosts_on_its_inherited_socket():
    """The launcher binds the port and rank 0 hosts the store on that socket (STORE_FD_ENV): the port is
    never free for another process to take, as a port found free and bound later by rank 0 was."""
    with socket.create_server(("127.0.0.1", 0)) as store:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.slurm.allreduce_rank"],
                cwd=REPO_ROOT,
                env={
                    **_without_launcher_vars(os.environ),
                    "RANK": str(rank),
                    "WORLD_SIZE": "2",
                    "LOCAL_RANK": str(rank),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(store.getsockname()[1]),
                    **({STORE_FD_ENV: str(store.fileno())} if rank == 0 else {}),
                },
                pass_fds=(store.fileno(),) if rank == 0 else (),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(2)
        ]
    records = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        records += [
            json.loads(line[len("RESULT ") :]) for line in out.splitlines() if line.startswith("RESULT ")
        ]
    assert sorted(r["rank"] for r in records) == [0, 1]
    assert {r["sum"] for r in records} == {3.0}
    assert {r["source"] for r in records} == {"torchrun"}


@pytest.mark.slurm
def test_scontrol_expands_nodelists_and_resolves_fake_nodes(slurm_cluster):
    assert scontrol_hostnames("node[1-3],node4") == ["node1", "node2", "node3", "node4"]
    assert scontrol_node_addr("node2") == "127.0.0.1"  # the dev cluster's fake nodes live on loopback


TORCHRUN_RANK_0 = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}


def test_the_store_socket_and_torchruns_agent_store_are_read_from_the_environment():
    assert DistEnv.from_environ({**TORCHRUN_RANK_0, STORE_FD_ENV: "7"}).store_fd == 7
    assert DistEnv.from_environ(TORCHRUN_RANK_0).store_fd is None
    assert DistEnv.from_environ({**TORCHRUN_RANK_0, AGENT_STORE_ENV: "True"}).agent_store
    assert not DistEnv.from_environ({**TORCHRUN_RANK_0, AGENT_STORE_ENV: "False"}).agent_store


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({STORE_FD_ENV: "x\n"}, f"torchrun environment:{STORE_FD_ENV}: must be an integer"),
        ({STORE_FD_ENV: "-1"}, "-1 is rank 0's own store socket"),
        ({STORE_FD_ENV: "7", "RANK": "1"}, "7 is rank 0's own store socket, but this is rank 1"),
        ({STORE_FD_ENV: "7", AGENT_STORE_ENV: "True"}, "torchrun's agent hosts the store"),
    ],
)
def test_a_store_socket_where_none_can_be_is_a_config_error(extra, message):
    with pytest.raises(ConfigError, match=message):
        DistEnv.from_environ({**TORCHRUN_RANK_0, **extra})


def test_a_store_socket_number_that_names_no_listening_socket_on_the_port_is_refused(tmp_path):
    """A number leaked into another process's environment names some other file there, or none: refused
    before torch is handed it."""
    timeout = timedelta(seconds=5)
    with open(tmp_path / "f", "w") as file, socket.create_server(("127.0.0.1", 0)) as other:
        for fd, reason in [
            (file.fileno(), "is not an open socket here"),
            (other.fileno(), "is not a socket listening on MASTER_PORT 29400"),
            (1 << 20, "is not an open socket here"),
        ]:
            env = DistEnv.from_environ({**TORCHRUN_RANK_0, STORE_FD_ENV: str(fd)})
            with pytest.raises(ConfigError, match=f"{STORE_FD_ENV}: {fd} {reason}"):
                rendezvous_store(env, timeout)


def _without_launcher_vars(environ) -> dict[str, str]:
    return {k: v for k, v in environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}


def test_nccl_on_a_node_without_cuda_is_one_config_error_before_any_group():
    """Issue 12: a job asking for NCCL on a CPU node used to die minutes in, 44 traceback lines per rank."""
    import torch

    from hpcrl.distributed.env import check_backend_here
    from hpcrl.errors import ConfigError

    check_backend_here("gloo")
    if torch.cuda.is_available():
        pytest.skip("this node has CUDA: nccl is fine here")
    with pytest.raises(ConfigError) as err:
        check_backend_here("nccl")
    [problem] = err.value.problems
    assert problem.key == "parallel.backend" and "needs CUDA" in problem.message and "\n" not in str(problem)
