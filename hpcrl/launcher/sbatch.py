"""ClusterConfig -> sbatch parameters -> the exact sbatch script, rendered by ONE pure function.

The text is produced by submitit's own renderer (`submitit.slurm.slurm._make_sbatch_string`) with the
very parameters that `SlurmExecutor` is given on submit, so a dry run shows byte for byte what a
submit sends to sbatch.

Shell safety: no config value is ever pasted into shell code. #SBATCH values are shlex-quoted by
submitit and, in addition, restricted here to characters Slurm uses (a newline in a directive would
end the comment and start a shell line). `env` values become `export KEY=<shlex-quoted value>`:
inert single-quoted data whatever they contain (`$(...)`, backticks, `;`, newlines, quotes).
The resolved config itself travels as a file path, never as shell text.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from hpcrl.launcher.config import ClusterConfig

_DIRECTIVE_SAFE = re.compile(r"[\w.,:&|!*+\[\]()@/%=-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE_NAME = re.compile(r"[\w.+/@:-]+")
_JOB_NAME_UNSAFE = re.compile(r"[^\w.-]")

DIRECTIVE_FIELDS = ("partition", "account", "qos", "gres", "constraint")
"""ClusterConfig fields that become #SBATCH directives verbatim."""

REQUEUE_SIGNAL_NOTE = (
    "submitit asks for --signal=USR2@<signal_delay_s>; its handler calls the element's checkpoint() hook "
    "and requeues the element (see hpcrl.launcher.element)."
)


def check_cluster(cluster: ClusterConfig) -> list[tuple[str, str]]:
    """Values that cannot safely become sbatch directives or shell names, as (dotted key, message)."""
    out = []
    for name in DIRECTIVE_FIELDS:
        value = getattr(cluster, name)
        if value is not None and not _DIRECTIVE_SAFE.fullmatch(value):
            out.append((f"cluster.{name}", f"{value!r} has characters Slurm does not use in a {name}"))
    for key, value in cluster.env.items():
        if not _ENV_NAME.fullmatch(key):
            out.append((f"cluster.env.{key}", "is not a valid environment variable name"))
        if "\0" in value:
            out.append((f"cluster.env.{key}", "contains a NUL byte"))
    for module in cluster.modules:
        if not _MODULE_NAME.fullmatch(module):
            out.append(("cluster.modules", f"{module!r} is not a module name"))
    if cluster.container is not None and not _MODULE_NAME.fullmatch(cluster.container):
        out.append(("cluster.container", f"{cluster.container!r} is not an image reference"))
    return out


def job_name(name: str) -> str:
    """A job name that is the same in squeue as in the config, minus characters a shell could misread."""
    return "hpcrl-" + _JOB_NAME_UNSAFE.sub("_", name)[:64]


def mem_text(mem_gb: float) -> str:
    from submitit.slurm.slurm import _convert_mem

    return _convert_mem(mem_gb)


def setup_lines(cluster: ClusterConfig) -> list[str]:
    """Shell lines run in the batch script before srun: modules, exported env, the profile's setup."""
    lines = [f"module load {shlex.quote(m)}" for m in cluster.modules]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(cluster.env.items())]
    return lines + list(cluster.setup)


def sbatch_parameters(cluster: ClusterConfig, name: str) -> dict[str, Any]:
    """SlurmExecutor.update_parameters(...) arguments (sbatch's own names) for one array job."""
    params: dict[str, Any] = {
        "job_name": job_name(name),
        "time": cluster.time_min,
        "nodes": cluster.nodes,
        "ntasks_per_node": cluster.tasks_per_node,
        "cpus_per_task": cluster.cpus_per_task,
        "array_parallelism": cluster.array_parallelism,
        "signal_delay_s": cluster.signal_delay_s,
        "setup": setup_lines(cluster),
        "wckey": None,  # submitit would add --wckey=submitit; many clusters have no wckeys
        "stderr_to_stdout": False,
    }
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(cluster, key) is not None:
            params[key] = getattr(cluster, key)
    if cluster.gres:
        params["gres"] = cluster.gres
    elif cluster.gpus_per_node:
        params["gpus_per_node"] = cluster.gpus_per_node
    if cluster.mem_gb is not None:
        params["mem"] = mem_text(cluster.mem_gb)
    if cluster.exclusive:
        params["exclusive"] = True
    if cluster.container:
        params["srun_args"] = [f"--container-image={cluster.container}"]
    return params


def submitit_command(python: str, folder: str | Path) -> str:
    """The command submitit's SlurmExecutor runs on every rank (its `_submitit_command_str`)."""
    return " ".join([shlex.quote(python), "-u -m submitit.core._submit", shlex.quote(str(folder))])


def render_sbatch(params: dict[str, Any], folder: str | Path, num_tasks: int, python: str) -> str:
    """The exact sbatch script of an array job of `num_tasks` elements. Pure: no I/O, no clock.

    Like submitit, one element is a plain job (no --array).
    """
    from submitit.slurm.slurm import _make_sbatch_string

    map_count = num_tasks if num_tasks > 1 else None
    return _make_sbatch_string(
        command=submitit_command(python, folder), folder=folder, map_count=map_count, **params
    )
