"""The `slurm` executor: array jobs through submitit, element states, scancel.

Elements whose sbatch parameters are equal (the usual case: a sweep over training keys) share ONE
array job; a sweep over e.g. `cluster.nodes` becomes one array per distinct resource shape. Arrays
hold at most MaxArraySize elements (read from `scontrol show config`).

States (`element_states`) come from accounting (sacct) where it answers: every attempt of a job
(`sacct -D`: a requeued job has one row per attempt), of which the latest counts. An attempt that ended
by TIMEOUT, PREEMPTED or NODE_FAIL is not the job's end while the controller still lists the job
(submitit's handler requeued it after the time-limit signal, or Slurm did after a preemption or a node
failure): squeue's state then stands, so `status` never reports an end the job has not reached. Where it does not (no
slurmdbd, or it is down) they are never left stale: squeue says which elements are still queued or
running (with Slurm's reason); an element squeue no longer lists has ended, and `scontrol show job`
(for MinJobAge after the end) says how, else submitit's result file (`<id>_0_result.pkl`: success,
or the traceback); an element that none of them knows any more ended without a result (killed before
submitit could write one) and is LOST, which `hpcrl resume` runs again. The result file is read as
pickle opcodes, never unpickled (nothing it holds is executed).
"""

from __future__ import annotations

import os
import pickletools
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrl.cluster.config import ClusterConfig
from hpcrl.config.safe_read import read_capped
from hpcrl.config.yaml_io import canonical_json
from hpcrl.errors import ClusterError, cut
from hpcrl.launcher.sbatch import render_sbatch, sbatch_parameters

DEFAULT_MAX_ARRAY_SIZE = 1001
"""Slurm's default MaxArraySize, used by dry runs when the controller cannot be asked."""


TIME_FORMAT = {"SLURM_TIME_FORMAT": "standard"}
"""Slurm's client commands print times in the user's SLURM_TIME_FORMAT (`relative`, any strftime): the
rows hpcrl orders by time are asked for in the standard ISO form, whatever the caller's environment."""


def _run(cmd: Sequence[str], timeout: float = 60) -> str:
    exe = shutil.which(cmd[0])
    if exe is None:
        raise ClusterError(f"`{cmd[0]}` is not on PATH: is this a Slurm login node?")
    env = {**os.environ, **TIME_FORMAT}
    try:
        proc = subprocess.run(
            [exe, *cmd[1:]], capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
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


_RECORD_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_record(line: str) -> dict[str, str]:
    """One line of `scontrol show <entity> -o` -> {key: value}.

    Values may hold spaces (`OS=Linux 6.1 #1 SMP`, `Reason=Not responding`): a value runs until the next
    ` Key=` (a word of letters, digits, _ : / right before an '='), or the end of the line."""
    matches = list(_RECORD_KEY.finditer(line))
    record: dict[str, str] = {}
    for match, following in zip(matches, [*matches[1:], None][: len(matches)], strict=True):
        end = following.start() if following else len(line)
        record[match.group(1)] = line[match.end() : end].strip()
    return record


def parse_records(text: str) -> list[dict[str, str]]:
    """Every non-empty line of `scontrol show <entity> -o` output, parsed."""
    return [parse_record(line) for line in text.splitlines() if "=" in line]


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
    cluster: ClusterConfig
    """The `cluster` section of its first element: every element of the array asks for the same resources
    (hpcrl.launcher.preflight fits it to the cluster and derives what the profile left unset)."""


def plan_arrays(elements: Iterable, name: str, limit: int) -> list[ArrayJob]:
    """Group elements by their sbatch parameters, then cut each group into arrays of <= `limit`.

    Reads the elements once and keeps their indices only (a sweep's elements are made one at a time).
    Consecutive elements that share their `cluster` object (a sweep that leaves it alone) share one
    rendering of the parameters."""
    groups: dict[str, tuple[dict[str, Any], list[int], ClusterConfig]] = {}
    last_cluster: Any = None
    indices: list[int] = []
    for element in elements:
        cluster = element.config.cluster
        if cluster is not last_cluster:
            params = sbatch_parameters(cluster, name)
            group = groups.setdefault(canonical_json(params), (params, [], cluster))
            last_cluster, indices = cluster, group[1]
        indices.append(element.index)
    return [
        ArrayJob(params, members[start : start + limit], cluster.max_requeues, cluster)
        for params, members, cluster in groups.values()
        for start in range(0, len(members), limit)
    ]


def sbatch_test_only(script: str) -> str | None:
    """Slurm's verdict on a batch script, submitting nothing (`sbatch --test-only`, script on stdin):
    None when the controller would accept it, else its error lines joined."""
    exe = shutil.which("sbatch")
    if exe is None:
        raise ClusterError("`sbatch` is not on PATH: is this a Slurm login node?")
    try:
        proc = subprocess.run(
            [exe, "--test-only"], input=script, capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired:
        raise ClusterError("`sbatch --test-only` did not answer within 60s") from None
    if proc.returncode == 0:
        return None
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    return "; ".join(lines) or f"exit {proc.returncode}"


def submit_array(
    params: dict, folder: Path, config_paths: list[str], run_dirs: list[str], max_requeues: int = 3
) -> tuple[str, list[str], str]:
    """Submit one array job (ONE sbatch call); returns (job id, each element's job id, the sbatch script).

    `max_requeues` (cluster.max_requeues) bounds submitit's requeues after the time-limit signal.

    submitit submits a single element as a plain job (id 'N', not 'N_0'); the ids it reports are kept.
    """
    # submitit and the rank machinery (~0.6 s): only a real submission needs the pickled task
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


@dataclass(frozen=True)
class Observed:
    """What a source says of one element: its state and why (Slurm's reason, the exception's first line)."""

    state: str
    reason: str | None = None


ACTIVE = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"})
"""States in which an element is still the scheduler's (squeue lists it)."""
REASON_CHARS = 200
"""A reason is cut to this many characters (it may quote a user value)."""
NO_REASON = frozenset({"", "None", "(null)", "N/A"})


def parse_rows(text: str) -> dict[str, Observed]:
    """`JobID|State[|Reason[|ExitCode]]` lines (sacct -P, squeue -o '%i|%T|%r') -> {'<array>_<task>':
    Observed}; compressed pending ranges are expanded, 'CANCELLED by 0' is CANCELLED, and a FAILED
    job's reason says its exit code when Slurm gives no other."""
    out: dict[str, Observed] = {}
    for line in text.splitlines():
        if "|" not in line:
            continue
        job_id, state, reason, exit_code, *_ = [*line.split("|"), "", "", ""]
        observed = _observed(state, reason, exit_code)
        for one in expand_job_ids(job_id.strip()):
            out[one] = observed
    return out


def _observed(state: str, reason: str, exit_code: str) -> Observed:
    return Observed(state.split()[0] if state.strip() else "UNKNOWN", _reason(reason, exit_code, state))


def _reason(reason: str, exit_code: str, state: str) -> str | None:
    reason = reason.strip()
    code = exit_code.strip()
    if reason in NO_REASON:
        reason = ""
    if code and code not in ("0:0", "") and not state.startswith(("COMPLETED", "PENDING", "RUNNING")):
        reason = f"{reason} (exit {code})" if reason else f"exit {code}"
    return cut(reason, REASON_CHARS) if reason else None


SACCT_HISTORY = "JobID,State,Reason,ExitCode,Submit,Start"
"""The fields of `sacct -D` rows that parse_history reads."""
_ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
_NOT_YET = "~"
"""Sorts after every ISO time: an attempt that has not started yet is newer than one that has."""


def parse_history(text: str) -> dict[str, Observed]:
    """`sacct -D -P` rows (SACCT_HISTORY) -> each job's LATEST attempt, as Observed.

    A requeued job has one row per attempt, and each attempt gets the requeue time as its Submit time;
    sacct does not print them in attempt order (nor does it, without -D, always pick the last one), so
    the row with the latest (Submit, Start) wins, a Start not known yet counting as later than any, and
    of equal times the row printed last. Times are compared as the ISO text `_run` asks for."""
    latest: dict[str, tuple[tuple[str, str, int], Observed]] = {}
    for position, line in enumerate(text.splitlines()):
        fields = line.split("|")
        if len(fields) < 6:
            continue
        job_id, state, reason, exit_code, submit, start = fields[:6]
        observed = _observed(state, reason, exit_code)
        order = (_time_key(submit), _time_key(start), position)
        for one in expand_job_ids(job_id.strip()):
            if one not in latest or order >= latest[one][0]:
                latest[one] = (order, observed)
    return {job_id: observed for job_id, (_, observed) in latest.items()}


def _time_key(text: str) -> str:
    text = text.strip()
    return text if _ISO_TIME.fullmatch(text) else _NOT_YET


def parse_sacct(text: str) -> dict[str, str]:
    """`sacct -X -P -n -o JobID,State` lines -> {'<array>_<task>': STATE} ('CANCELLED by 0' -> CANCELLED)."""
    return {job_id: observed.state for job_id, observed in parse_rows(text).items()}


def parse_scontrol_jobs(text: str) -> dict[str, Observed]:
    """`scontrol show job -o` records -> {'<array>_<task>' (a plain job: its id): Observed}."""
    out: dict[str, Observed] = {}
    for record in parse_records(text):
        state = record.get("JobState", "UNKNOWN").split()[0]
        observed = Observed(state, _reason(record.get("Reason", ""), record.get("ExitCode", ""), state))
        array, task = record.get("ArrayJobId"), record.get("ArrayTaskId")
        if array and task:
            for one in expand_job_ids(f"{array}_[{task}]"):
                out[one] = observed
        elif "JobId" in record:
            out[record["JobId"]] = observed
    return out


MAX_RESULT_BYTES = 64 << 20
"""submitit's result file holds ('success', an element's small return) or ('error', a traceback)."""


def result_path(folder: Path, job_id: str) -> Path:
    """submitit's result file of rank 0 of an element (its JobPaths.result_pickle: '<job id>_0_result.pkl')."""
    return folder / f"{job_id}_0_result.pkl"


def read_result(path: Path) -> Observed | None:
    """What submitit's result file says, without unpickling it: it holds ('success', result) or ('error',
    traceback text), so the first two strings among its opcodes are the tag and, for an error, the
    traceback. None when there is no such file (or it is not that shape, or not a regular file of at most
    MAX_RESULT_BYTES)."""
    try:  # a regular file of bounded size: a FIFO or /dev/zero here must not hang or fill memory
        data = read_capped(path, MAX_RESULT_BYTES, follow_symlinks=False)
    except (OSError, ValueError):
        return None
    strings = []
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"):
                strings.append(arg)
                if len(strings) == 2:
                    break
    except (ValueError, EOFError):  # a truncated or foreign file: whatever strings were read so far
        pass
    if strings[:1] == ["success"]:
        return Observed("COMPLETED")
    if strings[:1] == ["error"]:
        return Observed("FAILED", exception_line(strings[1]) if len(strings) > 1 else None)
    return None


def exception_line(traceback_text: str) -> str | None:
    """The first line of the exception a traceback ends with ('RuntimeError: boom'): the line after the
    last indented (frame) line; for a message of several lines, its first."""
    lines = traceback_text.rstrip().splitlines()
    last_frame = max((i for i, line in enumerate(lines) if line[:1].isspace()), default=-1)
    rest = [line for line in lines[last_frame + 1 :] if line.strip()]
    return cut(rest[0].strip(), REASON_CHARS) if rest else None


def element_states(folder: Path, job_ids: Sequence[str]) -> tuple[dict[str, Observed], str | None]:
    """The state of each of these elements ('<array>_<task>' or a plain job id) and, when accounting did
    not answer, one line saying where the states came from instead (see the module docstring).
    Elements no source knows are left out (their last known state stands). Reasons: Slurm's, and for a
    failed element the first line of its exception (submitit's result file)."""
    if not job_ids:
        return {}, None
    arrays = sorted({job_id.split("_")[0] for job_id in job_ids})
    try:
        rows = _run(["sacct", "-X", "-P", "-D", "-n", "-o", SACCT_HISTORY, "-j", ",".join(arrays)])
        observed, note = parse_history(rows), None
        observed.update(_requeued(observed, job_ids))
    except ClusterError as err:
        why = _first_line(err).split("): ", 1)[-1]  # _run says "`cmd` failed (exit 1): <stderr>"
        observed, note = _without_accounting(folder, job_ids, arrays), f"no accounting (sacct: {why})"
    out = {}
    for job_id in job_ids:
        seen = observed.get(job_id)
        if seen is not None and seen.state not in ACTIVE and seen.state != "COMPLETED":
            result = read_result(result_path(folder, job_id))  # the exception says more than Slurm
            if result is not None and result.reason:
                seen = Observed(seen.state, result.reason)
        if seen is not None:
            out[job_id] = seen
    if note:
        note += ": states from squeue, scontrol show job and submitit's result files"
    return out, note


REQUEUABLE_ENDS = frozenset({"TIMEOUT", "PREEMPTED", "NODE_FAIL"})
"""An attempt's ends after which the job may run again: submitit's handler requeues it after the
time-limit signal (while requeues are left), Slurm after a preemption or a node failure (JobRequeue)."""


def _requeued(observed: dict[str, Observed], job_ids: Sequence[str]) -> dict[str, Observed]:
    """squeue's state of each element whose latest attempt ended in REQUEUABLE_ENDS and that the
    controller still lists (requeued: PENDING with BeginTime, or still COMPLETING the kill). The requeue
    is made by the job's own processes or by the controller before the attempt has fully ended, so an
    element squeue no longer lists has really ended. {} when squeue does not answer (sacct's stands)."""
    ended = [job_id for job_id in job_ids if job_id in observed and observed[job_id].state in REQUEUABLE_ENDS]
    if not ended:
        return {}
    arrays = ",".join(sorted({job_id.split("_")[0] for job_id in ended}))
    live = _ask_controller(["squeue", "-h", "-r", "-o", "%i|%T|%r", "-j", arrays], parse_rows) or {}
    return {job_id: live[job_id] for job_id in ended if job_id in live and live[job_id].state in ACTIVE}


def _without_accounting(folder: Path, job_ids: Sequence[str], arrays: list[str]) -> dict[str, Observed]:
    """squeue, then scontrol show job for elements squeue no longer lists, then result files; LOST for an
    element that none of them knows while the controller answers."""
    ids = ",".join(arrays)
    live = _ask_controller(["squeue", "-h", "-r", "-o", "%i|%T|%r", "-j", ids], parse_rows)
    observed = dict(live or {})
    ended = [job_id for job_id in job_ids if job_id not in observed]
    known = None
    if ended:
        known = {}
        for array in sorted({job_id.split("_")[0] for job_id in ended}):  # scontrol takes one id
            answer = _ask_controller(["scontrol", "show", "job", "-o", array], parse_scontrol_jobs)
            if answer is None:
                known = None
                break
            known.update(answer)
        for job_id in ended:
            seen = (known or {}).get(job_id)
            if seen is None or seen.state in ACTIVE:  # the controller forgot it, or squeue raced its end
                seen = read_result(result_path(folder, job_id)) or seen
            if seen is None and live is not None and known is not None:
                seen = Observed("LOST", "ended without a result file; no longer known to squeue or scontrol")
            if seen is not None:
                observed[job_id] = seen
    return observed


def _ask_controller(cmd: list[str], parse) -> dict[str, Observed] | None:
    """A parsed answer; {} when the controller knows none of the ids (it says 'Invalid job id'); None when
    it did not answer."""
    try:
        return parse(_run(cmd))
    except ClusterError as err:
        return {} if "Invalid job id" in str(err) else None


def _first_line(err: Exception) -> str:
    return cut(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__, REASON_CHARS)


def scancel(job_ids: Sequence[str]) -> None:
    if job_ids:
        _run(["scancel", *job_ids])


def log_paths(folder: Path, job_id: str) -> list[Path]:
    """submitit's stdout/stderr files of rank 0 of an array element ('<array>_<task>')."""
    array_id, _, task = job_id.partition("_")
    stem = f"{array_id}_{task}_0_log" if task else f"{job_id}_0_log"
    return [folder / f"{stem}.out", folder / f"{stem}.err"]
