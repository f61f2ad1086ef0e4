"""The `slurm` executor: array jobs through submitit, states from sacct, scancel.

Elements whose sbatch parameters are equal (the usual case: a sweep over training keys) share ONE
array job; a sweep over e.g. `cluster.nodes` becomes one array per distinct resource shape. Arrays
hold at most MaxArraySize elements (read from `scontrol show config`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrl.config.yaml_io import canonical_json
from hpcrl.errors import ClusterError
from hpcrl.launcher.sbatch import render_sbatch, sbatch_parameters

DEFAULT_MAX_ARRAY_SIZE = 1001
"""Slurm's default MaxArraySize, used by dry runs when the controller cannot be asked."""


def _run(cmd: Sequence[str], timeout: float = 60) -> str:
    exe = shutil.which(cmd[0])
    if exe is None:
        raise ClusterError(f"`{cmd[0]}` is not on PATH: is this a Slurm login node?")
    try:
        proc = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(cmd)}` did not answer within {timeout:.0f}s") from None
    if proc.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def parse_max_array_size(scontrol_config: str) -> int:
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", scontrol_config, re.MULTILINE)
    if not match:
        raise ClusterError("`scontrol show config` has no MaxArraySize line")
    return int(match.group(1))


def max_array_size() -> int:
    """Largest number of elements one array job may have (indices 0..MaxArraySize-1)."""
    return parse_max_array_size(_run(["scontrol", "show", "config"]))


@dataclass(frozen=True)
class ArrayJob:
    """One array job to submit: its sbatch parameters and the sweep indices of its elements."""

    params: dict[str, Any]
    indices: list[int]
    max_requeues: int
    """cluster.max_requeues of its first element (a sweep cannot vary it)."""


def plan_arrays(elements: Iterable, name: str, limit: int) -> list[ArrayJob]:
    """Group elements by their sbatch parameters, then cut each group into arrays of <= `limit`.

    Reads the elements once and keeps their indices only (a sweep's elements are made one at a time).
    Consecutive elements that share their `cluster` object (a sweep that leaves it alone) share one
    rendering of the parameters."""
    groups: dict[str, tuple[dict[str, Any], list[int], int]] = {}
    last_cluster: Any = None
    indices: list[int] = []
    for element in elements:
        cluster = element.config.cluster
        if cluster is not last_cluster:
            params = sbatch_parameters(cluster, name)
            group = groups.setdefault(canonical_json(params), (params, [], cluster.max_requeues))
            last_cluster, indices = cluster, group[1]
        indices.append(element.index)
    return [
        ArrayJob(params, members[start : start + limit], max_requeues)
        for params, members, max_requeues in groups.values()
        for start in range(0, len(members), limit)
    ]


def submit_array(
    params: dict, folder: Path, config_paths: list[str], run_dirs: list[str], max_requeues: int = 3
) -> tuple[str, list[str], str]:
    """Submit one array job (ONE sbatch call); returns (job id, each element's job id, the sbatch script).

    `max_requeues` (cluster.max_requeues) bounds submitit's requeues after the time-limit signal.

    submitit submits a single element as a plain job (id 'N', not 'N_0'); the ids it reports are kept.
    """
    import submitit

    from hpcrl.launcher.element import ElementTask

    try:
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=max_requeues)
    except RuntimeError as err:
        raise ClusterError(str(err)) from None
    executor.update_parameters(**params)
    script = render_sbatch(params, folder, len(config_paths), python=sys.executable)
    try:
        jobs = executor.map_array(ElementTask(), config_paths, run_dirs)
    except (subprocess.CalledProcessError, submitit.core.utils.FailedJobError, OSError) as err:
        raise ClusterError(f"sbatch failed: {err}") from None
    return jobs[0].job_id.split("_")[0], [job.job_id for job in jobs], script


_ARRAY_RANGE = re.compile(r"^(\d+)_\[([^\]]+)\]$")


def expand_job_ids(job_id: str) -> list[str]:
    """sacct/squeue's compressed pending ids: '12_[3-5,9%2]' -> ['12_3', '12_4', '12_5', '12_9']."""
    match = _ARRAY_RANGE.match(job_id)
    if not match:
        return [job_id]
    base, spec = match.group(1), match.group(2).split("%")[0]
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += [f"{base}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def parse_sacct(text: str) -> dict[str, str]:
    """`sacct -X -P -n -o JobID,State` lines -> {'<array>_<task>': STATE} ('CANCELLED by 0' -> CANCELLED)."""
    states: dict[str, str] = {}
    for line in text.splitlines():
        if "|" not in line:
            continue
        job_id, state = line.split("|")[:2]
        for one in expand_job_ids(job_id.strip()):
            states[one] = state.split()[0] if state.strip() else "UNKNOWN"
    return states


def sacct_states(array_ids: Sequence[str]) -> dict[str, str]:
    """States of the elements of these array jobs: sacct, or squeue (queued jobs only) when accounting
    does not answer; elements neither knows are left out (the caller keeps their last known state)."""
    if not array_ids:
        return {}
    ids = ",".join(sorted(set(array_ids)))
    try:
        return parse_sacct(_run(["sacct", "-X", "-P", "-n", "-o", "JobID,State", "-j", ids]))
    except ClusterError as sacct_error:
        try:
            return parse_sacct(_run(["squeue", "-h", "-r", "-o", "%i|%T", "-j", ids]))
        except ClusterError:
            raise sacct_error from None


def scancel(job_ids: Sequence[str]) -> None:
    if job_ids:
        _run(["scancel", *job_ids])


def log_paths(folder: Path, job_id: str) -> list[Path]:
    """submitit's stdout/stderr files of rank 0 of an array element ('<array>_<task>')."""
    array_id, _, task = job_id.partition("_")
    stem = f"{array_id}_{task}_0_log" if task else f"{job_id}_0_log"
    return [folder / f"{stem}.out", folder / f"{stem}.err"]
