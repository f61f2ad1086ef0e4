"""The rules of a cluster config alone: sbatch directive text, environment names, module names and
numbers, each as (dotted key, message). They run at expand/submit for every element
(hpcrl.experiment.rules) and again on the ranks.

Why these rules: `cluster.*` values become #SBATCH directives, exported environment variables and
`module load` arguments in the batch script (hpcrl.launcher.sbatch renders it); a value that steers which
code runs, or that sbatch would take as given (`--mem=-10GB`), must be refused before anything is
submitted.
"""

from __future__ import annotations

import re

from hpcrl.cluster.config import ClusterConfig
from hpcrl.errors import short

_DIRECTIVE_SAFE = re.compile(r"[\w.,:&|!*+\[\]()@/%=-]+")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_MODULE_NAME = re.compile(r"[\w.+/@:][\w.+/@:-]*")  # never a leading '-': it would be an option

DIRECTIVE_FIELDS = ("partition", "account", "qos", "gres", "constraint")
"""ClusterConfig fields that become #SBATCH directives verbatim."""


ENV_FORBIDDEN = {
    "PATH": "it chooses the programs the batch script and the ranks run (srun included)",
    "HOME": "Python adds ~/.local site-packages (and runs usercustomize) from it",
    "BASH_ENV": "every non-interactive bash sources the file it names",
    "ENV": "sh sources the file it names",
    "IFS": "it changes how bash splits words",
    "PS4": "bash expands it (command substitution included) when tracing",
    "SHELLOPTS": "it sets bash options in every child bash",
    "BASHOPTS": "it sets bash options in every child bash",
    "PROMPT_COMMAND": "bash runs it as a command",
    "GLIBC_TUNABLES": "the dynamic loader parses it at every exec",
    "GCONV_PATH": "glibc loads character-set converters from it",
    "CUDA_INJECTION64_PATH": "CUDA loads the library it names into every process",
}
"""Environment names a config may not set, and why: each changes which code runs, not how it runs."""
ENV_FORBIDDEN_PREFIXES = {
    "LD_": "the dynamic loader reads them (LD_PRELOAD, LD_LIBRARY_PATH, ...)",
    "SLURM_": "srun reads them (SLURM_TASK_PROLOG runs a program in every task)",
    "SRUN_": "srun reads them",
    "SBATCH_": "sbatch reads them",
    "SUBMITIT_": "submitit reads them in every rank",
    "PYTHON": "they change the interpreter (PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, ...)",
}
"""Environment name prefixes a config may not use, and why."""
ENV_ALLOWED = frozenset(
    {
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONFAULTHANDLER",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONSAFEPATH",
    }
)
"""PYTHON* names that only tune the interpreter (hashing, buffering, encodings, a safer sys.path).
An allowlist: every Python release adds PYTHON* variables, and a denylist would miss the next one."""


def env_problems(env: dict[str, str]) -> list[tuple[str, str]]:
    """`cluster.env` names that are not plain upper-case names or that steer code, as (key, message).

    Not every dangerous variable of every program can be listed; the rule blocks those that bash, srun,
    the loader and Python read before any hpcrl code runs. The values need no rule of their own beyond
    the text rule (hpcrl.config.text_rules): they are always one shlex-quoted word."""
    out = []
    for name in env:
        key = f"cluster.env.{name}"
        if not _ENV_NAME.fullmatch(name):
            out.append((key, f"{short(name)} is not an environment variable name ([A-Z_][A-Z0-9_]*)"))
        elif name in ENV_FORBIDDEN:
            out.append((key, f"may not be set from a config: {ENV_FORBIDDEN[name]}"))
        elif name not in ENV_ALLOWED:
            prefix = next((p for p in ENV_FORBIDDEN_PREFIXES if name.startswith(p)), None)
            if prefix:
                out.append((key, f"{prefix}* may not be set from a config: {ENV_FORBIDDEN_PREFIXES[prefix]}"))
    return out


def check_cluster(cluster: ClusterConfig) -> list[tuple[str, str]]:
    """Values that cannot safely become sbatch directives or shell names, as (dotted key, message)."""
    out = []
    for name in DIRECTIVE_FIELDS:
        value = getattr(cluster, name)
        if value is not None and not _DIRECTIVE_SAFE.fullmatch(value):
            out.append((f"cluster.{name}", f"{short(value)} has characters Slurm does not use in a {name}"))
    out += env_problems(cluster.env)
    for module in cluster.modules:
        if not _MODULE_NAME.fullmatch(module):
            out.append(("cluster.modules", f"{short(module)} is not a module name"))
    if cluster.container is not None and not _MODULE_NAME.fullmatch(cluster.container):
        out.append(("cluster.container", f"{short(cluster.container)} is not an image reference"))
    return out + _range_problems(cluster)


def _range_problems(cluster: ClusterConfig) -> list[tuple[str, str]]:
    """Numbers sbatch would take as given (`--mem=-10GB`) or that break the job's own schedule: the
    warning signal must come inside the time limit, or the job is told to save and stop the moment it
    starts (USR2@300 on a 1-minute job was killed after 8 s, FAILED)."""
    limit_s = cluster.time_min * 60
    rules = _upper_bounds(cluster) + [
        ("cluster.gpus_per_node", cluster.gpus_per_node >= 0, f"must be >= 0, got {cluster.gpus_per_node}"),
        (
            "cluster.mem_gb",
            cluster.mem_gb is None or 0 < cluster.mem_gb <= MAX_MEM_GB,
            f"must be in (0, {MAX_MEM_GB}] GB (or null: the partition's default), got {cluster.mem_gb}",
        ),
        (
            "cluster.signal_delay_s",
            cluster.signal_delay_s >= 0,
            f"must be >= 0, got {cluster.signal_delay_s}",
        ),
        (
            "cluster.signal_delay_s",
            cluster.signal_delay_s < 0 or cluster.time_min < 1 or cluster.signal_delay_s < limit_s,
            f"the warning signal {cluster.signal_delay_s} s before the end must come after the start: "
            f"below cluster.time_min = {cluster.time_min} min = {limit_s} s",
        ),
        ("cluster.stop_grace_s", cluster.stop_grace_s >= 0, f"must be >= 0, got {cluster.stop_grace_s}"),
    ]
    return [(key, message) for key, ok, message in rules if not ok]


MAX_COUNTS = {
    "nodes": 1 << 20,
    "tasks_per_node": 1 << 16,
    "cpus_per_task": 1 << 16,
    "gpus_per_node": 1 << 10,
    "time_min": 10 * 366 * 24 * 60,
    "array_parallelism": 1 << 20,
    "max_requeues": 1 << 16,
}
"""Upper bounds far above any machine (10 years of time limit, 65,536 CPUs per task): a larger value is
a typo or an attack, and sbatch would take it as given (`#SBATCH --time=10^30`)."""
MAX_MEM_GB = 1 << 20
"""1 PiB per node; also refuses inf and NaN (the comparison is False for NaN)."""


def _upper_bounds(cluster: ClusterConfig) -> list[tuple[str, bool, str]]:
    return [
        (f"cluster.{name}", value is None or value <= bound, f"must be <= {bound}, got {short(value)}")
        for name, bound in MAX_COUNTS.items()
        if isinstance(value := getattr(cluster, name), int | None)
    ]
