"""Where this process sits in a distributed job, read from the launcher's environment.

`DistEnv.from_environ()` looks at, in order:
1. Slurm (a task launched by `srun`): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
   SLURM_STEP_TASKS_PER_NODE, SLURM_JOB_NODELIST. The master is the first node of the nodelist,
   resolved to its `NodeAddr` through `scontrol show node`: node names need not resolve in DNS (they
   don't on the dev cluster, whose fake nodes all live on 127.0.0.1), and on real clusters the address
   Slurm talks to is the one that reaches the node. The port is derived from SLURM_JOB_ID, so every
   task of a job computes the same one without talking to the others; each array element is its own
   job with its own SLURM_JOB_ID, hence its own port. MASTER_ADDR / MASTER_PORT, when set, win.
2. torchrun-style RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT. A process started by
   torchrun (TORCHELASTIC_RUN_ID set) uses these even inside a Slurm step: there torchrun, not srun,
   made the ranks.
3. Otherwise a single process (rank 0 of 1).

A Slurm *batch script* (no `srun` step) is a single process even though SLURM_NTASKS says how many
tasks the allocation has: ranks only exist once srun starts them.

`init_process_group(env)` then forms the default torch.distributed group (gloo on CPU, nccl on CUDA)
at the TCP store `rendezvous_store(env)` opens: rank 0 hosts it on master_port, on the listening socket
its launcher bound when there is one (STORE_FD_ENV), or torchrun's agent hosts it (AGENT_STORE_ENV).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from hpcrl.distributed.config import ParallelConfig
from hpcrl.errors import ClusterError, ConfigError, Problem

if TYPE_CHECKING:
    import torch.distributed

PORT_BASE = 20000
"""First port of the range that Slurm jobs derive their rendezvous port from (below Linux's
ephemeral range 32768-60999, above the dev cluster's daemon ports)."""
PORT_SPAN = 10000
"""Size of that range: jobs whose ids differ by less than this never share a port."""
DEFAULT_TORCH_PORT = 29500
"""torch's own default MASTER_PORT, used when a torchrun-style or single process names none."""
STORE_FD_ENV = "HPCRL_STORE_FD"
"""Rank 0's inherited listening socket (a file descriptor) to host the TCP store on. A launcher on one
host binds it before any rank exists (hpcrl.launcher.rank_server, hpcrl.distributed.spawn): a port that
one process finds free and another binds seconds later can be taken in between by any socket the kernel
gives an ephemeral port, such as another job's gloo pair (EADDRINUSE in a loaded CI run of 2fc79dc)."""
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
"""torchrun sets it to "True" when its agent already hosts the store on MASTER_PORT: every rank is a
client (torch.distributed.rendezvous reads it the same way)."""

Source = Literal["slurm", "torchrun", "single"]
Hostnames = Callable[[str], list[str]]
NodeAddr = Callable[[str], str]


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    """This process's place in the job: global rank, node, and the rendezvous address of rank 0."""

    rank: int
    """Global rank, 0 <= rank < world_size."""
    world_size: int
    """Number of ranks in the job (step)."""
    local_rank: int
    """Rank among the ranks on this node (selects the GPU)."""
    node_rank: int
    """Index of this node among the job's nodes."""
    master_addr: str
    """Address of rank 0's node, where the TCP store listens."""
    master_port: int
    """Port of the TCP store."""
    node_name: str
    """Name of this node (SLURMD_NODENAME under Slurm: fake dev nodes all share one hostname)."""
    job_id: str | None = None
    """Scheduler job id (None outside Slurm)."""
    local_world_size: int = 1
    """Number of ranks on this node."""
    source: Source = "single"
    """Which launcher's environment this was read from."""
    store_fd: int | None = None
    """Rank 0 only: the listening socket on master_port that its launcher bound (STORE_FD_ENV); None:
    rank 0 binds master_port itself."""
    agent_store: bool = False
    """torchrun's agent hosts the store on master_port (AGENT_STORE_ENV): no rank hosts one."""

    def __post_init__(self) -> None:
        problems = []
        if self.world_size < 1:
            problems.append(Problem(f"world_size must be >= 1, got {self.world_size}", key="world_size"))
        if not 0 <= self.rank < max(self.world_size, 1):
            problems.append(Problem(f"rank {self.rank} is outside [0, {self.world_size})", key="rank"))
        if not 0 <= self.local_rank < max(self.local_world_size, 1):
            problems.append(
                Problem(
                    f"local_rank {self.local_rank} is outside [0, {self.local_world_size})", key="local_rank"
                )
            )
        if not 0 < self.master_port < 65536:
            problems.append(Problem(f"master_port {self.master_port} is not a TCP port", key="master_port"))
        if self.store_fd is not None and (self.rank != 0 or self.agent_store or self.store_fd < 0):
            problems.append(
                Problem(
                    f"{self.store_fd} is rank 0's own store socket, but this is rank {self.rank}"
                    + (" and torchrun's agent hosts the store" if self.agent_store else ""),
                    key=STORE_FD_ENV,
                )
            )
        if problems:
            raise ConfigError(
                [Problem(p.message, file=f"{self.source} environment", key=p.key) for p in problems]
            )

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        hostnames: Hostnames | None = None,
        node_addr: NodeAddr | None = None,
    ) -> DistEnv:
        """Read the environment (Slurm, then torchrun, else single process); see the module docstring.

        `hostnames` expands a Slurm nodelist and `node_addr` maps a node name to its address; both
        default to asking `scontrol`, and are parameters so that the parsing can be tested alone.
        """
        if "TORCHELASTIC_RUN_ID" not in environ and _is_slurm_task(environ):
            return _from_slurm(
                environ,
                hostnames or (lambda nodelist: scontrol_hostnames(nodelist, environ)),
                node_addr or (lambda name: scontrol_node_addr(name, environ)),
            )
        if "RANK" in environ and "WORLD_SIZE" in environ:
            return _from_torchrun(environ)
        return cls(
            rank=0,
            world_size=1,
            local_rank=0,
            node_rank=0,
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(environ, "MASTER_PORT", "single", DEFAULT_TORCH_PORT),
            node_name=environ.get("SLURMD_NODENAME") or socket.gethostname(),
            job_id=environ.get("SLURM_JOB_ID"),
            source="single",
        )

    def torchrun_environ(self) -> dict[str, str]:
        """The torchrun-style variables for libraries that read them (megatron, vLLM, HF)."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def _is_slurm_task(environ: Mapping[str, str]) -> bool:
    # SLURM_STEP_ID is set in srun-launched tasks; the batch script of sbatch has none.
    return all(key in environ for key in ("SLURM_PROCID", "SLURM_STEP_ID", "SLURM_JOB_NODELIST"))


def _int(environ: Mapping[str, str], key: str, source: str, default: int | None = None) -> int:
    raw = environ.get(key)
    if raw is None:
        if default is None:
            raise ConfigError(Problem("is required but not set", file=f"{source} environment", key=key))
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            Problem(f"must be an integer, got {raw!r}", file=f"{source} environment", key=key)
        ) from None


def _from_slurm(environ: Mapping[str, str], hostnames: Hostnames, node_addr: NodeAddr) -> DistEnv:
    # The step's own counts (an srun may use fewer tasks than the allocation), else the job's.
    tasks_key = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
    world_size = _int(environ, tasks_key, "slurm", 1)
    node_rank = _int(environ, "SLURM_NODEID", "slurm", 0)
    tasks_per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    local_world_size = tasks_on_node(tasks_per_node, node_rank) if tasks_per_node else 1
    job_id = environ.get("SLURM_JOB_ID")
    if "MASTER_ADDR" in environ:
        master_addr = environ["MASTER_ADDR"]
    else:
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ["SLURM_JOB_NODELIST"]
        nodes = hostnames(nodelist)
        if not nodes:
            raise ConfigError(
                Problem(
                    f"expands to no node: {nodelist!r}", file="slurm environment", key="SLURM_JOB_NODELIST"
                )
            )
        master_addr = node_addr(nodes[0])
    if "MASTER_PORT" in environ:
        master_port = _int(environ, "MASTER_PORT", "slurm")
    else:
        if job_id is None:
            raise ConfigError(
                Problem(
                    "is needed to derive MASTER_PORT (or set MASTER_PORT)",
                    file="slurm environment",
                    key="SLURM_JOB_ID",
                )
            )
        master_port = port_for_job(job_id)
    return DistEnv(
        rank=_int(environ, "SLURM_PROCID", "slurm"),
        world_size=world_size,
        local_rank=_int(environ, "SLURM_LOCALID", "slurm", 0),
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        node_name=environ.get("SLURMD_NODENAME") or socket.gethostname(),
        job_id=job_id,
        local_world_size=local_world_size,
        source="slurm",
    )


def _from_torchrun(environ: Mapping[str, str]) -> DistEnv:
    rank = _int(environ, "RANK", "torchrun")
    world_size = _int(environ, "WORLD_SIZE", "torchrun")
    local_rank = _int(environ, "LOCAL_RANK", "torchrun", rank)
    return DistEnv(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        node_rank=_int(environ, "GROUP_RANK", "torchrun", 0),
        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(environ, "MASTER_PORT", "torchrun", DEFAULT_TORCH_PORT),
        node_name=environ.get("SLURMD_NODENAME") or socket.gethostname(),
        job_id=environ.get("SLURM_JOB_ID"),
        local_world_size=_int(environ, "LOCAL_WORLD_SIZE", "torchrun", max(world_size, local_rank + 1)),
        source="torchrun",
        store_fd=_int(environ, STORE_FD_ENV, "torchrun") if STORE_FD_ENV in environ else None,
        agent_store=environ.get(AGENT_STORE_ENV) == "True",
    )


def port_for_job(job_id: str) -> int:
    """Rendezvous port of a Slurm job: PORT_BASE + (job id mod PORT_SPAN).

    Consecutive job ids get distinct ports (jobs sharing a first node don't collide unless their ids
    differ by a multiple of PORT_SPAN). Ids like "123_4" or "123+1" use their leading number plus the
    suffix; a non-numeric id is hashed (crc32, stable across processes unlike `hash`).
    Two steps of one job that form groups at the same time share this port: give them MASTER_PORT.
    """
    match = re.fullmatch(r"(\d+)(?:[_+](\d+))?", job_id.strip())
    if match:
        key = int(match.group(1)) + int(match.group(2) or 0)
    else:
        key = zlib.crc32(job_id.encode())
    return PORT_BASE + key % PORT_SPAN


_TASKS_PER_NODE = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def parse_tasks_per_node(value: str) -> list[int]:
    """Expand Slurm's compressed tasks-per-node list: "2(x3),1" -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in value.split(","):
        match = _TASKS_PER_NODE.fullmatch(part.strip())
        if not match:
            raise ConfigError(
                Problem(
                    f"cannot parse {value!r} (expected e.g. '2(x3),1')",
                    file="slurm environment",
                    key="SLURM_STEP_TASKS_PER_NODE",
                )
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def tasks_on_node(value: str, node_rank: int) -> int:
    """Number of tasks on node `node_rank` according to a tasks-per-node list."""
    counts = parse_tasks_per_node(value)
    if not 0 <= node_rank < len(counts):
        raise ConfigError(
            Problem(
                f"node {node_rank} is outside the tasks-per-node list {value!r}",
                file="slurm environment",
                key="SLURM_NODEID",
            )
        )
    return counts[node_rank]


def parse_node_addr(scontrol_node_text: str) -> str | None:
    """The NodeAddr field of `scontrol show node <name>` output (None if absent)."""
    match = re.search(r"(?:^|\s)NodeAddr=(\S+)", scontrol_node_text)
    return match.group(1) if match else None


def _scontrol(*args: str, environ: Mapping[str, str] | None = None) -> str:
    """Run scontrol; SLURM_CONF comes from `environ` when it names one (the job's own cluster)."""
    env = dict(os.environ)
    if environ is not None and "SLURM_CONF" in environ:
        env["SLURM_CONF"] = environ["SLURM_CONF"]
    exe = shutil.which("scontrol", path=env.get("PATH"))
    if exe is None:
        raise ClusterError(f"`scontrol {' '.join(args)}` needed, but scontrol is not on PATH")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=30, check=False)
    if proc.returncode != 0:
        raise ClusterError(
            f"`scontrol {' '.join(args)}` failed (exit {proc.returncode}): {proc.stderr.strip()}"
        )
    return proc.stdout


def scontrol_hostnames(nodelist: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """Expand a Slurm hostlist ("node[1-3],gpu7") with `scontrol show hostnames`."""
    if not re.search(r"[\[,]", nodelist):
        return [nodelist.strip()] if nodelist.strip() else []
    return _scontrol("show", "hostnames", nodelist, environ=environ).split()


def scontrol_node_addr(node_name: str, environ: Mapping[str, str] | None = None) -> str:
    """Address of a node as Slurm knows it (its NodeAddr), falling back to the name itself."""
    return parse_node_addr(_scontrol("show", "node", "--oneliner", node_name, environ=environ)) or node_name


def resolve_backend(backend: str) -> str:
    """auto -> nccl when CUDA is available, else gloo; explicit names pass through."""
    if backend != "auto":
        return backend
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def check_backend_here(backend: str) -> None:
    """One line, before any group forms, when this node cannot run the backend the config asks for
    (otherwise NCCL on a CPU node dies minutes later in a 44-line traceback per rank)."""
    import torch
    import torch.distributed as dist

    if backend != "nccl":
        return
    missing = [
        what
        for what, ok in (("CUDA", torch.cuda.is_available()), ("NCCL", dist.is_nccl_available()))
        if not ok
    ]
    if missing:
        raise ConfigError(
            [
                Problem(
                    f"backend nccl needs {' and '.join(missing)}, which this node ({socket.gethostname()}) "
                    f"lacks (torch {torch.__version__}); use auto (gloo without GPUs) or a GPU node",
                    key="parallel.backend",
                )
            ]
        )


def init_process_group(
    env: DistEnv, backend: str = ParallelConfig.backend, timeout_s: float = ParallelConfig.timeout_s
) -> torch.distributed.ProcessGroup:
    """Form the default process group of `env` and return it (pass it on explicitly).

    With CUDA, the rank's device is set from its local rank first (one GPU per rank). A single
    process uses an in-memory store: it needs no port.
    """
    import torch
    import torch.distributed as dist

    backend = resolve_backend(backend)
    check_backend_here(backend)
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    timeout = timedelta(seconds=timeout_s)
    if env.world_size == 1:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        store = rendezvous_store(env, timeout)
        dist.init_process_group(
            backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout
        )
    return dist.group.WORLD


def rendezvous_store(env: DistEnv, timeout: timedelta) -> torch.distributed.Store:
    """The TCP store where the ranks of `env` meet (torch.distributed.rendezvous's tcp:// store, with
    the launcher's socket): rank 0 hosts it on master_port, on its inherited listening socket when
    `env.store_fd` (STORE_FD_ENV: no other process could take the port), else by binding the port; with
    torchrun's agent store every rank is a client. Rank 0 waits until every rank has connected."""
    import torch.distributed as dist

    hosts = env.rank == 0 and not env.agent_store
    if env.store_fd is not None:
        _check_store_socket(env)
    return dist.TCPStore(
        env.master_addr,
        env.master_port,
        env.world_size,
        is_master=hosts,
        timeout=timeout,
        multi_tenant=hosts and env.store_fd is None,  # as torch's own: another store in this process
        master_listen_fd=env.store_fd,
    )


def _check_store_socket(env: DistEnv) -> None:
    """`env.store_fd` must be a socket listening on master_port: a number that leaked into the
    environment of another process names some other file there, or none."""
    try:
        with socket.socket(fileno=os.dup(env.store_fd)) as sock:
            listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            port = sock.getsockname()[1] if sock.family in (socket.AF_INET, socket.AF_INET6) else None
    except OSError as err:
        reason = f"is not an open socket here ({err.strerror})"
    else:
        if listening and port == env.master_port:
            return
        reason = f"is not a socket listening on MASTER_PORT {env.master_port}"
    raise ConfigError(Problem(f"{env.store_fd} {reason}", file=f"{env.source} environment", key=STORE_FD_ENV))
