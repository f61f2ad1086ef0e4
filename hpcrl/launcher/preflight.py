"""Preflight against the live cluster: does each array job fit the partition it asks for?

A job that cannot fit is accepted by some Slurm configurations and then waits in the queue forever
(a time limit above the partition's MaxTime: PENDING with reason PartitionTimeLimit), or is refused
by sbatch only after the configs and the manifest were written. So before anything is written,
`hpcrl submit` (and `hpcrl resume`) ask the controller once, with three read-only calls:

  scontrol show config                MaxArraySize (and: does a controller answer at all?)
  scontrol --all show partition -o    each partition: Default, MaxTime, MaxNodes, MaxCPUsPerNode, MaxMemPerNode
  scontrol --all show node -o         each node: CPUs, RealMemory, Gres, features, partitions

and check every array job (one per resource shape) with `fit`, a pure function:

  partition    cluster.partition exists (or the cluster has a default partition)
  time         cluster.time_min <= the partition's MaxTime (cluster.signal_delay_s < cluster.time_min is a
               config rule checked at expand: hpcrl.launcher.sbatch)
  per node     tasks_per_node x cpus_per_task CPUs, mem_gb, the GRES (gres or gpus_per_node) and the
               constraint's features fit at least one node of the partition; then enough such nodes
               for cluster.nodes

then let Slurm judge the exact script with `sbatch --test-only` (what we do not model: QOS, accounts,
reservations, ...). Each problem is one line naming the key (`cluster.cpus_per_task: ...`); any problem
is exit 2 and nothing is written or submitted.

CPUs per task derived from the node: a profile may leave `cluster.cpus_per_task` unset (the a100-ib
profile does); it is then the CPUs of the smallest node that fits the rest of the request, divided by
cluster.tasks_per_node (a 64-CPU node with 8 ranks: 8), and OMP_NUM_THREADS follows it unless
cluster.env sets it (hpcrl.launcher.sbatch.setup_lines). The config itself keeps `null` (its id does
not depend on the cluster it ran on); the script in the manifest shows the value sent.
Fallback, when no node list can be read: --cpus-per-task is left out and Slurm's default applies
(one CPU per task), said in one line.

When no controller answers, `hpcrl submit` stops with a cluster error (exit 1, nothing written: it could
not submit anyway); a dry run says so in one line, renders with the fallbacks and goes on. A dry run
with a controller runs the same checks and prints the problems as warnings (it still renders: a dry
run is also how one reads the script for another cluster).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hpcrl.cluster.config import ClusterConfig
from hpcrl.errors import ClusterError, Problem, cut
from hpcrl.launcher import slurm
from hpcrl.launcher.cluster_view import (
    ClusterView,
    Node,
    Partition,
    ask_controller,
    constraint_ok,
    format_minutes,
    parse_gres,
)
from hpcrl.launcher.sbatch import render_sbatch, sbatch_parameters

INDICES_SHOWN = 8
"""Element indices quoted in a problem shared by several elements."""
TEST_ONLY_CHARS = 300
"""sbatch --test-only's refusal is quoted up to this many characters."""


# --- the fit of one resource shape (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    cpus_per_task: int | None
    """The CPUs per task to send: cluster.cpus_per_task, or derived from the node; None: left to Slurm."""
    problems: list[Problem]
    """One per problem, each naming its dotted key."""
    note: str | None = None
    """Why cpus_per_task could not be derived (it is then left to Slurm), if it could not."""


def requested_gres(cluster: ClusterConfig) -> dict[str, int] | None:
    """What one node must hold: parse_gres(cluster.gres), else {"gpu": gpus_per_node}; None: unread form."""
    if cluster.gres:
        return parse_gres(cluster.gres)
    return {"gpu": cluster.gpus_per_node} if cluster.gpus_per_node > 0 else {}


def fit(cluster: ClusterConfig, view: ClusterView) -> Fit:
    """Problems of one resource shape on this cluster, and the CPUs per task to ask for."""
    given = cluster.cpus_per_task
    if view.partitions is None or view.nodes is None:
        return Fit(given, [], None if given else f"no node list: {view.unavailable}")
    name = cluster.partition or view.default_partition
    listed = ", ".join(sorted(view.partitions)) or "none"
    if name is None:
        message = f"not set, and the cluster has no default partition ({listed})"
        return Fit(given, [Problem(message, key="cluster.partition")])
    partition = view.partitions.get(name)
    if partition is None:
        message = f"no partition {name!r} on this cluster (partitions: {listed})"
        return Fit(given, [Problem(message, key="cluster.partition")])
    problems = _time_problems(cluster, partition)
    if partition.max_nodes is not None and cluster.nodes > partition.max_nodes:
        message = f"{cluster.nodes} nodes, but partition {name}'s MaxNodes is {partition.max_nodes}"
        problems.append(Problem(message, key="cluster.nodes"))
    members = [n for n in view.nodes if name in n.partitions]
    per_node, eligible = _node_problems(cluster, partition, members)
    problems += per_node
    if members and len(members) < cluster.nodes:
        message = f"{cluster.nodes} nodes, but partition {name} has {len(members)}"
        problems.append(Problem(message, key="cluster.nodes"))
    elif not per_node and len(eligible) < cluster.nodes:
        message = (
            f"{cluster.nodes} node(s) asked, but {len(eligible)} of partition {name}'s {len(members)} "
            "node(s) meet every per-node request together"
        )
        problems.append(Problem(message, key="cluster.nodes"))
    if given is not None:
        return Fit(given, problems)
    if not eligible:
        return Fit(None, problems, f"no node of partition {name} meets the other requests")
    smallest = min(_cpus(n, partition) for n in eligible)
    return Fit(smallest // cluster.tasks_per_node, problems)


def _cpus(node: Node, partition: Partition) -> int:
    if partition.max_cpus_per_node is None:
        return node.cpus
    return min(node.cpus, partition.max_cpus_per_node)


def _time_problems(cluster: ClusterConfig, partition: Partition) -> list[Problem]:
    limit_s = cluster.time_min * 60
    if partition.max_time_s is None or limit_s <= partition.max_time_s:
        return []
    message = (
        f"{cluster.time_min} min is above partition {partition.name}'s MaxTime "
        f"{format_minutes(partition.max_time_s)} ({partition.max_time_s // 60} min): the job would "
        "wait in the queue for ever (PartitionTimeLimit)"
    )
    return [Problem(message, key="cluster.time_min")]


Check = tuple[str, Callable[[Node], "bool | None"], Callable[[], str]]
"""(key, verdict on one node (None: cannot judge), the message when no node passes)."""


def _node_problems(
    cluster: ClusterConfig, partition: Partition, members: list[Node]
) -> tuple[list[Problem], list[Node]]:
    """Each per-node request that no node of the partition meets (one problem per key), and the nodes
    that meet all of them together. A check that cannot judge a node (None) lets it pass."""
    if not members:
        return [Problem(f"partition {partition.name} has no nodes", key="cluster.partition")], []
    problems = []
    eligible = list(members)
    for key, check, message in _node_checks(cluster, partition, members):
        verdicts = [check(n) for n in members]
        if not any(v is None or v for v in verdicts):
            problems.append(Problem(message(), key=key))
        eligible = [n for n in eligible if check(n) is not False]
    return problems, eligible


def _node_checks(cluster: ClusterConfig, partition: Partition, members: list[Node]) -> list[Check]:
    name, tasks = partition.name, cluster.tasks_per_node
    most_cpus = max(_cpus(n, partition) for n in members)
    checks: list[Check] = []
    if cluster.cpus_per_task is not None:
        per_node = tasks * cluster.cpus_per_task
        checks.append(
            (
                "cluster.cpus_per_task",
                lambda n: per_node <= _cpus(n, partition),
                lambda: (
                    f"{tasks} tasks x {cluster.cpus_per_task} CPUs = {per_node} CPUs per node, but "
                    f"partition {name}'s nodes have at most {most_cpus}; unset, it is the node's CPUs / "
                    "cluster.tasks_per_node"
                ),
            )
        )
    else:
        checks.append(
            (
                "cluster.tasks_per_node",
                lambda n: tasks <= _cpus(n, partition),
                lambda: f"{tasks} tasks per node, but partition {name}'s nodes have at most {most_cpus} CPUs",
            )
        )
    wanted = requested_gres(cluster)
    if wanted:
        checks.append(
            (
                "cluster.gres" if cluster.gres else "cluster.gpus_per_node",
                lambda n: None if n.gres is None else all(n.gres.get(k, 0) >= v for k, v in wanted.items()),
                lambda: (
                    f"{_gres_text(wanted)} per node, but partition {name}'s nodes have "
                    + _listing(sorted({_gres_text(n.gres or {}) or "no GRES" for n in members}))
                ),
            )
        )
    if cluster.mem_gb is not None:
        mem_mb = cluster.mem_gb * 1024  # Slurm's GB is 1024 MB (submitit writes --mem=<N>GB)
        limit = partition.max_mem_per_node_mb
        checks.append(
            (
                "cluster.mem_gb",
                lambda n: mem_mb <= n.memory_mb and (limit is None or mem_mb <= limit),
                lambda: (
                    f"{cluster.mem_gb:g} GB per node, but partition {name}'s nodes have at most "
                    f"{max(n.memory_mb for n in members) / 1024:g} GB"
                    + (f" (MaxMemPerNode {limit / 1024:g} GB)" if limit is not None else "")
                ),
            )
        )
    if cluster.constraint:
        checks.append(
            (
                "cluster.constraint",
                lambda n: constraint_ok(cluster.constraint, n.features),
                lambda: (
                    f"no node of partition {name} has the features {cluster.constraint!r} (there: "
                    + _listing(sorted({",".join(sorted(n.features)) or "none" for n in members}))
                    + ")"
                ),
            )
        )
    return checks


def _gres_text(counts: dict[str, int]) -> str:
    typed = {k: v for k, v in counts.items() if ":" in k}
    shown = typed or counts
    for key in typed:  # a name with types is shown by its types
        shown.pop(key.partition(":")[0], None)
    return ",".join(f"{k}:{v}" for k, v in sorted(shown.items()))


def _listing(items: list[str], limit: int = 4) -> str:
    more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


# --- the sweep's arrays ---------------------------------------------------------------------------------


def check_arrays(
    arrays: Iterable[Any],
    view: ClusterView | None,
    name: str,
    test_only: Callable[[dict[str, Any], int], str | None] | None = None,
) -> tuple[list[Any], list[Problem], list[str]]:
    """Fit every array job (hpcrl.launcher.slurm.ArrayJob) to the cluster: returns the arrays with the
    parameters to send (CPUs per task derived where unset), the problems (one per key and message,
    naming the elements it concerns) and notes (one line each: a fallback taken).

    `view` None: no controller; every array keeps its own values. `test_only(params, n)`: Slurm's
    verdict on the rendered script (None: accepted), asked for arrays with no problem of ours."""
    out, notes = [], []
    failures: dict[Problem, list[int]] = {}
    elements = 0
    for array in arrays:
        elements += len(array.indices)
        result = fit(array.cluster, view) if view is not None else Fit(array.cluster.cpus_per_task, [])
        params = sbatch_parameters(array.cluster, name, cpus_per_task=result.cpus_per_task)
        out.append(dataclasses.replace(array, params=params))
        problems = list(result.problems)
        if not problems and test_only is not None:
            refusal = test_only(params, len(array.indices))
            if refusal:
                message = f"sbatch --test-only refuses the script: {cut(refusal, TEST_ONLY_CHARS)}"
                problems.append(Problem(message, key="cluster"))
        for problem in problems:  # the same problem of several arrays: one, naming all their elements
            failures.setdefault(problem, []).extend(array.indices[:INDICES_SHOWN])
        if array.cluster.cpus_per_task is None and result.cpus_per_task is None and not problems:
            why = result.note or (view.unavailable if view else "no controller answered")
            notes.append(
                f"cluster.cpus_per_task is not set and cannot be derived from the node ({why}): "
                "--cpus-per-task left to Slurm's default (1 CPU per task)"
            )
    problems = [
        dataclasses.replace(problem, message=problem.message + _elements_text(indices, elements))
        for problem, indices in failures.items()
    ]
    return out, problems, list(dict.fromkeys(notes))


def _elements_text(indices: list[int], elements: int) -> str:
    if elements <= 1:
        return ""
    shown = sorted(set(indices))
    more = ", ..." if len(shown) > INDICES_SHOWN else ""
    return f" [sweep element(s) {', '.join(map(str, shown[:INDICES_SHOWN]))}{more}]"


@dataclass
class Plan:
    """The array jobs to submit, fitted to the cluster, with what the preflight found."""

    arrays: list[Any]
    problems: list[Problem]
    """Reasons to refuse the submission (submit/resume: exit 2; a dry run: warnings)."""
    notes: list[str]
    """One line each: a fallback taken (no controller, no node list, CPUs left to Slurm)."""


def plan(
    elements: Iterable[Any],
    name: str,
    folder: Any,
    *,
    need_controller: bool,
    fit_to_cluster: bool = True,
    python: str | None = None,
) -> Plan:
    """Ask the controller, group the elements into array jobs and fit each to the cluster.

    `need_controller`: a submit (ClusterError when no controller answers, nothing written yet); a dry
    run goes on without one, with Slurm's default MaxArraySize and no checks. `fit_to_cluster` False
    (the local executor's dry run): the arrays only, as rendered for reading. `folder`: the sweep's
    submitit folder, named in the scripts that sbatch --test-only reads."""
    notes: list[str] = []
    try:
        view: ClusterView | None = ask_controller()
    except ClusterError as err:
        if need_controller:
            raise
        view = None
        if fit_to_cluster:
            notes.append(
                f"no Slurm controller answered ({_first_line(err)}): no preflight, MaxArraySize "
                f"{slurm.DEFAULT_MAX_ARRAY_SIZE}"
            )
    limit = view.max_array_size if view else slurm.DEFAULT_MAX_ARRAY_SIZE
    arrays = slurm.plan_arrays(elements, name, limit)
    if not fit_to_cluster:
        return Plan(arrays, [], [])
    if view is not None and view.unavailable:
        notes.append(f"{view.unavailable}: only sbatch --test-only checks the request")

    def test_only(params: dict[str, Any], tasks: int) -> str | None:
        script = render_sbatch(params, folder, tasks, python or sys.executable)
        try:
            return slurm.sbatch_test_only(script)
        except ClusterError as err:
            if need_controller:
                raise
            notes.append(f"sbatch --test-only not run: {_first_line(err)}")
            return None

    fitted, problems, fit_notes = check_arrays(arrays, view, name, test_only if view else None)
    return Plan(fitted, problems, notes + fit_notes)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return cut(text.splitlines()[0] if text else type(err).__name__, 200)
