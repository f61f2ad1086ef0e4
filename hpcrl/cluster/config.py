"""Config owned by the launcher: where and how an experiment's array elements run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from hpcrl.config.ranges import Range

MAX_TIME_MIN = 10 * 366 * 24 * 60
"""Ten years: a longer time limit is a typo or an attack, and sbatch would take it as given
(`#SBATCH --time=10^30`). The other counts' bounds (65,536 CPUs per task, 2^20 nodes) are as far above
any machine."""
MAX_MEM_GB = 1 << 20
"""1 PiB per node."""


@dataclass(kw_only=True)
class ClusterConfig:
    """Executor and Slurm resources of ONE array element. A profile in slurm/profiles/ fills defaults."""

    executor: Literal["local", "slurm"] = "local"
    """local: run on this machine (no Slurm); slurm: one array job per sweep through submitit."""
    profile: str | None = None
    """Cluster profile whose values are defaults for this section: a name, looked up in the repository's
    slurm/profiles/ and in $XDG_CONFIG_HOME/hpcrl/profiles/; a file path only on the command line
    (--cluster.profile PATH). Never swept (hpcrl.cluster.profiles)."""
    partition: str | None = None
    """Slurm partition."""
    account: str | None = None
    """Slurm account."""
    qos: str | None = None
    """Slurm QOS."""
    nodes: Annotated[int, Range(ge=1, le=1 << 20)] = 1
    """Nodes per array element."""
    tasks_per_node: Annotated[int, Range(ge=1, le=1 << 16)] = 1
    """Ranks per node (one per GPU on GPU clusters). With the local executor, when no template, profile,
    sweep or command line sets it, the layout's rank count / nodes (hpcrl.experiment.elements)."""
    gpus_per_node: Annotated[int, Range(ge=0, le=1 << 10)] = 0
    """GPUs per node (--gpus-per-node)."""
    gres: str | None = None
    """Explicit --gres (e.g. gpu:a100:8); overrides gpus_per_node when set."""
    cpus_per_task: Annotated[int, Range(ge=1, le=1 << 16)] | None = None
    """CPUs per rank. Unset (null): on Slurm, the CPUs of the partition's smallest node that fits the
    request / tasks_per_node, read from the controller at submit (hpcrl.launcher.preflight); without a
    node list, left to Slurm's default (1). OMP_NUM_THREADS follows it unless `env` sets it."""
    mem_gb: Annotated[float, Range(gt=0, le=MAX_MEM_GB)] | None = None
    """Memory per node in GB (None: cluster default)."""
    time_min: Annotated[int, Range(ge=1, le=MAX_TIME_MIN)] = 60
    """Wall-clock limit of one element, minutes."""
    constraint: str | None = None
    """--constraint (e.g. a100&ib)."""
    exclusive: bool = False
    """Whole nodes."""
    array_parallelism: Annotated[int, Range(ge=1, le=1 << 20)] = 64
    """Array elements running at once (%N)."""
    signal_delay_s: Annotated[int, Range(ge=0, le=MAX_TIME_MIN * 60)] = 90
    """Seconds before the time limit at which Slurm signals every rank (submitit's --signal=USR2@N) so
    the element checkpoints (hpcrl.lifecycle relays it to the save trigger) and is requeued."""
    max_requeues: Annotated[int, Range(ge=0, le=1 << 16)] = 3
    """Times an element is requeued after its time-limit signal (submitit's max_num_timeout); each requeue
    resumes from the latest checkpoint. Preemptions do not count against it."""
    stop_grace_s: Annotated[float, Range(ge=0, le=3600)] = 5.0
    """Local executor: after Ctrl-C or SIGTERM of `hpcrl run` (forwarded to the ranks), or once one rank
    died, the other ranks get this many seconds to end on their own; then they are SIGKILLed."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment of every rank (e.g. NCCL_IB_HCA, OMP_NUM_THREADS): exported as single-quoted data, the
    last lines before srun. A name must be known-safe (OMP_*, MKL_*, NCCL_*, CUDA_*, TORCH_*, HF_*,
    WANDB_*, ... with no path, file, directory, library or plugin part: hpcrl.cluster.rules.ENV_SAFE_PREFIXES)
    or listed in `env_allow`; names that steer code (PATH, LD_*, PYTHON*, SLURM_*, ...) are refused."""
    env_allow: list[str] = field(default_factory=list)
    """More names `env` may set, each one accepted as only tuning how the job runs (e.g. [HF_HOME,
    NCCL_TOPO_FILE]). From a cluster profile or the command line only (--cluster.env_allow '[HF_HOME]'),
    never from a template or a sweep: a template from someone else would otherwise allow itself anything.
    Names that steer which code runs (PATH, LD_*, PYTHON*, SLURM_*, ...) cannot be allowed."""
    modules: list[str] = field(default_factory=list)
    """`module load` names run before the job."""
    container: str | None = None
    """Container image for srun --container-image (pyxis), if any."""
    setup: list[str] = field(default_factory=list)
    """Trusted shell lines run in the batch script before srun: from a profile only, never from a
    template, the command line or a sweep (hpcrl.cluster.profiles.setup_problems)."""
