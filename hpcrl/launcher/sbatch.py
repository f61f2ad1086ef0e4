"""ClusterConfig -> sbatch parameters -> the exact sbatch script, rendered by ONE pure function.

The text is produced by submitit's own renderer (`submitit.slurm.slurm._make_sbatch_string`) with the
very parameters that `SlurmExecutor` is given on submit, so a dry run shows byte for byte what a
submit sends to sbatch.

Shell safety: no config value is ever pasted into shell code. #SBATCH values are shlex-quoted by
submitit and, in addition, restricted here to characters Slurm uses. Every config string is one line of
printable text (hpcrl.config.text_rules), so no value can end a line of the script. The only shell text
that is not generated here is a cluster profile's `setup` (profiles come from trusted places only, see
hpcrl.cluster.profiles).

`cluster.env` becomes `export KEY=<shlex-quoted value>` lines, the last lines before srun. Why exports
in the script rather than a file the rank's Python reads: the variables must exist when the rank's
process starts (OpenMP and MKL read theirs when torch loads its libraries, glibc and CUDA at exec,
pyxis hands srun's environment to the container), which a file read later by Python cannot provide.
shlex.quote makes each value one single-quoted word, which bash never expands, and the value has no
line break to leave it; the dry run shows each export as it will run. The exports come after the
module loads and the profile's setup, so those run without them; what is left that reads the variables
is bash itself, srun, the dynamic loader and the ranks, hence the name rule in hpcrl.cluster.rules.env_problems.
The resolved config itself travels as a file path, never as shell text.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from hpcrl.cluster.config import ClusterConfig

_JOB_NAME_UNSAFE = re.compile(r"[^\w.-]")

REQUEUE_SIGNAL_NOTE = (
    "submitit asks for --signal=USR2@<signal_delay_s>; its handler calls the element's checkpoint() hook "
    "and requeues the element (see hpcrl.launcher.element)."
)


def job_name(name: str) -> str:
    """A job name that is the same in squeue as in the config, minus characters a shell could misread."""
    return "hpcrl-" + _JOB_NAME_UNSAFE.sub("_", name)[:64]


def mem_text(mem_gb: float) -> str:
    """sbatch's --mem value: whole GB as "<n>GB", else rounded down to MB (the form submitit writes)."""
    return f"{int(mem_gb)}GB" if mem_gb == int(mem_gb) else f"{int(mem_gb * 1024)}MB"


def setup_lines(cluster: ClusterConfig, cpus_per_task: int | None = None) -> list[str]:
    """Shell lines run in the batch script before srun: modules, the profile's setup, then the exported
    env (last: the template's env wins over what setup exported, and nothing else runs under it).

    OMP_NUM_THREADS is the rank's CPUs (`cpus_per_task`, given or derived from the node) unless the env
    sets it: without it, every rank's torch would use all of the node's cores."""
    lines = [f"module load {shlex.quote(m)}" for m in cluster.modules]
    lines += list(cluster.setup)
    env = dict(cluster.env)
    if cpus_per_task is not None:
        env.setdefault("OMP_NUM_THREADS", str(cpus_per_task))
    return lines + [f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())]


def sbatch_parameters(cluster: ClusterConfig, name: str, cpus_per_task: int | None = None) -> dict[str, Any]:
    """SlurmExecutor.update_parameters(...) arguments (sbatch's own names) for one array job.

    `cpus_per_task`: the value derived from the node (hpcrl.launcher.preflight) when cluster.cpus_per_task
    is unset; with neither, --cpus-per-task is left out (Slurm's default)."""
    cpus = cluster.cpus_per_task if cluster.cpus_per_task is not None else cpus_per_task
    params: dict[str, Any] = {
        "job_name": job_name(name),
        "time": cluster.time_min,
        "nodes": cluster.nodes,
        "ntasks_per_node": cluster.tasks_per_node,
        "array_parallelism": cluster.array_parallelism,
        "signal_delay_s": cluster.signal_delay_s,
        "setup": setup_lines(cluster, cpus),
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
    if cpus is not None:
        params["cpus_per_task"] = cpus
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
    # submitit has no public renderer; its own function is used on purpose, so that a dry run shows
    # byte for byte what SlurmExecutor sends (the golden files in tests/launcher catch a change in it).
    # Imported here: submitit's slurm module costs ~0.1 s, and expand never renders
    from submitit.slurm.slurm import _make_sbatch_string

    map_count = num_tasks if num_tasks > 1 else None
    return _make_sbatch_string(
        command=submitit_command(python, folder), folder=folder, map_count=map_count, **params
    )
