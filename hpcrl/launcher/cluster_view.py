"""What the controller says about its partitions and nodes: scontrol's output parsed into a
`ClusterView` (pure parsing, plus `ask_controller`, its three read-only calls). hpcrl.launcher.preflight
checks array jobs against it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpcrl.errors import ClusterError
from hpcrl.launcher import slurm
from hpcrl.launcher.slurm import parse_max_array_size, parse_records

UNLIMITED = None
"""A limit Slurm prints as UNLIMITED / INFINITE."""


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
