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
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hpcrl.cluster.config import ClusterConfig
from hpcrl.errors import ClusterError, Problem, cut
from hpcrl.launcher import slurm
from hpcrl.launcher.sbatch import render_sbatch, sbatch_parameters
from hpcrl.launcher.slurm import parse_max_array_size, parse_records

UNLIMITED = None
"""A limit Slurm prints as UNLIMITED / INFINITE."""
INDICES_SHOWN = 8
"""Element indices quoted in a problem shared by several elements."""
TEST_ONLY_CHARS = 300
"""sbatch --test-only's refusal is quoted up to this many characters."""


# --- parsing scontrol's values (pure; its one-line records: hpcrl.launcher.slurm.parse_record) ---------

_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def parse_time_s(text: str) -> int | None:
    """A Slurm duration in seconds; None for UNLIMITED/INFINITE. ValueError for anything else.

    Slurm's forms (sbatch(1) --time): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return UNLIMITED
    match = _TIME.fullmatch(text)
    if not match:
        raise ValueError(f"not a Slurm duration: {text!r}")
    days, a, b, c = match.groups()
    if days is not None:  # D-H[:M[:S]]
        hours, minutes, seconds = int(a), int(b or 0), int(c or 0)
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if c is not None:  # H:M:S
        return (int(a) * 60 + int(b)) * 60 + int(c)
    if b is not None:  # M:S
        return int(a) * 60 + int(b)
    return int(a) * 60  # M


def format_minutes(seconds: int) -> str:
    """A duration as Slurm writes MaxTime (D-HH:MM:SS), for messages."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def parse_limit(text: str | None) -> int | None:
    """A numeric partition limit; None for UNLIMITED, absent or unreadable (no limit we can check)."""
    if text is None:
        return UNLIMITED
    try:
        return int(text)
    except ValueError:
        return UNLIMITED


_GRES_ITEM = re.compile(r"([A-Za-z][\w.-]*)(?::([A-Za-z][\w.-]*))?(?::(\d+))?(?:\([^)]*\))?")


def parse_gres(text: str | None) -> dict[str, int] | None:
    """A GRES list (`gpu:a100:8(S:0-1),nic:1`, `gpu:2`, `(null)`) -> {"gpu": 8, "gpu:a100": 8, "nic": 1}:
    every name's total and every name:type's count. None when it is not a form we read (then the check
    is left to sbatch --test-only)."""
    counts: dict[str, int] = {}
    if text is None or text.strip() in ("", "(null)", "N/A"):
        return counts
    for item in _split_top_level(text.strip()):
        match = _GRES_ITEM.fullmatch(item)
        if not match:
            return None
        name, kind, count = match.group(1), match.group(2), int(match.group(3) or 1)
        counts[name] = counts.get(name, 0) + count
        if kind:
            counts[f"{name}:{kind}"] = counts.get(f"{name}:{kind}", 0) + count
    return counts


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside parentheses (`gpu:a100:8(S:0-1),nic:1`)."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def constraint_ok(constraint: str | None, features: frozenset[str]) -> bool | None:
    """Whether a node with `features` satisfies `constraint`; None when the expression is beyond the
    plain forms read here (`a&b`, `a|b`, `a,b`): brackets, counts, negation are sbatch's to judge."""
    if not constraint:
        return True
    if not re.fullmatch(r"[\w.-]+(?:[&|,][\w.-]+)*", constraint):
        return None
    if "|" in constraint and ("&" in constraint or "," in constraint):
        return None  # mixed AND/OR: Slurm's own precedence rules, not modelled here
    names = re.split(r"[&|,]", constraint)
    return any(n in features for n in names) if "|" in constraint else all(n in features for n in names)


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    max_time_s: int | None
    """None: UNLIMITED."""
    max_nodes: int | None
    max_cpus_per_node: int | None
    max_mem_per_node_mb: int | None


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gres: dict[str, int] | None
    """parse_gres of the node's Gres (None: a form not read here)."""
    features: frozenset[str]
    partitions: frozenset[str]


def parse_partition(record: dict[str, str]) -> Partition:
    try:
        max_time = parse_time_s(record.get("MaxTime", "UNLIMITED"))
    except ValueError:
        max_time = UNLIMITED
    return Partition(
        name=record.get("PartitionName", ""),
        default=record.get("Default") == "YES",
        max_time_s=max_time,
        max_nodes=parse_limit(record.get("MaxNodes")),
        max_cpus_per_node=parse_limit(record.get("MaxCPUsPerNode")),
        max_mem_per_node_mb=parse_limit(record.get("MaxMemPerNode")),
    )


def parse_node(record: dict[str, str]) -> Node:
    """A node record; CPUEfctv (CPUs minus specialized cores, Slurm >= 22.05) when present, else CPUTot."""
    features = record.get("AvailableFeatures", "")
    partitions = record.get("Partitions", "")
    return Node(
        name=record["NodeName"],
        cpus=int(record.get("CPUEfctv") or record.get("CPUTot") or 0),
        memory_mb=int(record.get("RealMemory") or 0),
        gres=parse_gres(record.get("Gres")),
        features=frozenset(f for f in features.split(",") if f and f != "(null)"),
        partitions=frozenset(p for p in partitions.split(",") if p and p != "(null)"),
    )


@dataclass(frozen=True)
class ClusterView:
    """What the controller said, once per command."""

    max_array_size: int
    partitions: dict[str, Partition] | None
    """None: the listing was refused (e.g. PrivateData); then only sbatch --test-only judges."""
    nodes: list[Node] | None
    unavailable: str | None = None
    """Why partitions/nodes are None."""

    @property
    def default_partition(self) -> str | None:
        return next((p.name for p in (self.partitions or {}).values() if p.default), None)


def view_from_text(config: str, partitions: str | None, nodes: str | None) -> ClusterView:
    """A ClusterView from the three commands' outputs (None: that command failed). Node records that
    do not say their partitions (no `Partitions=` on any) cannot be matched to one: no node list then."""
    max_array = parse_max_array_size(config)
    if partitions is None or nodes is None:
        return ClusterView(max_array, None, None, "scontrol show partition/node failed")
    records = [r for r in parse_records(nodes) if "NodeName" in r]
    if records and not any("Partitions" in r for r in records):
        return ClusterView(max_array, None, None, "the node records name no partitions")
    try:
        return ClusterView(
            max_array_size=max_array,
            partitions={p.name: p for p in map(parse_partition, parse_records(partitions)) if p.name},
            nodes=[parse_node(r) for r in records],
        )
    except (KeyError, ValueError) as err:  # a form not read here: sbatch --test-only still judges
        return ClusterView(max_array, None, None, f"unreadable partition/node records ({err!r})")


def ask_controller(run: Callable[[Sequence[str]], str] | None = None) -> ClusterView:
    """The controller's view; ClusterError (saying why) when no controller answers."""
    run = run or slurm._run
    config = run(["scontrol", "show", "config"])  # raises ClusterError: no controller
    listings = []
    for entity in ("partition", "node"):
        try:  # --all: hidden partitions (and their nodes) too; a user may be allowed into one
            listings.append(run(["scontrol", "--all", "show", entity, "-o"]))
        except ClusterError:
            listings.append(None)
    return view_from_text(config, *listings)


# --- the fit of one resource shape (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    cpus_per_task: int | None
    """The CPUs per task to send: cluster.cpus_per_task, or derived from the node; None: left to Slurm."""
    problems: list[tuple[str, str]]
    """(dotted key, message), one per problem."""
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
        return Fit(
            given, [("cluster.partition", f"not set, and the cluster has no default partition ({listed})")]
        )
    partition = view.partitions.get(name)
    if partition is None:
        return Fit(
            given, [("cluster.partition", f"no partition {name!r} on this cluster (partitions: {listed})")]
        )
    problems = _time_problems(cluster, partition)
    if partition.max_nodes is not None and cluster.nodes > partition.max_nodes:
        problems.append(
            (
                "cluster.nodes",
                f"{cluster.nodes} nodes, but partition {name}'s MaxNodes is {partition.max_nodes}",
            )
        )
    members = [n for n in view.nodes if name in n.partitions]
    per_node, eligible = _node_problems(cluster, partition, members)
    problems += per_node
    if members and len(members) < cluster.nodes:
        problems.append(("cluster.nodes", f"{cluster.nodes} nodes, but partition {name} has {len(members)}"))
    elif not per_node and len(eligible) < cluster.nodes:
        problems.append(
            (
                "cluster.nodes",
                f"{cluster.nodes} node(s) asked, but {len(eligible)} of partition {name}'s {len(members)} "
                "node(s) meet every per-node request together",
            )
        )
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


def _time_problems(cluster: ClusterConfig, partition: Partition) -> list[tuple[str, str]]:
    limit_s = cluster.time_min * 60
    if partition.max_time_s is None or limit_s <= partition.max_time_s:
        return []
    return [
        (
            "cluster.time_min",
            f"{cluster.time_min} min is above partition {partition.name}'s MaxTime "
            f"{format_minutes(partition.max_time_s)} ({partition.max_time_s // 60} min): the job would "
            "wait in the queue for ever (PartitionTimeLimit)",
        )
    ]


Check = tuple[str, Callable[[Node], "bool | None"], Callable[[], str]]
"""(key, verdict on one node (None: cannot judge), the message when no node passes)."""


def _node_problems(
    cluster: ClusterConfig, partition: Partition, members: list[Node]
) -> tuple[list[tuple[str, str]], list[Node]]:
    """Each per-node request that no node of the partition meets (one problem per key), and the nodes
    that meet all of them together. A check that cannot judge a node (None) lets it pass."""
    if not members:
        return [("cluster.partition", f"partition {partition.name} has no nodes")], []
    problems = []
    eligible = list(members)
    for key, check, message in _node_checks(cluster, partition, members):
        verdicts = [check(n) for n in members]
        if not any(v is None or v for v in verdicts):
            problems.append((key, message()))
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
    failures: dict[tuple[str, str], list[int]] = {}
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
                problems.append(
                    ("cluster", f"sbatch --test-only refuses the script: {cut(refusal, TEST_ONLY_CHARS)}")
                )
        for key_message in problems:
            failures.setdefault(key_message, []).extend(array.indices[:INDICES_SHOWN])
        if array.cluster.cpus_per_task is None and result.cpus_per_task is None and not problems:
            why = result.note or (view.unavailable if view else "no controller answered")
            notes.append(
                f"cluster.cpus_per_task is not set and cannot be derived from the node ({why}): "
                "--cpus-per-task left to Slurm's default (1 CPU per task)"
            )
    problems = [
        Problem(message + _elements_text(indices, elements), key=key)
        for (key, message), indices in failures.items()
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
