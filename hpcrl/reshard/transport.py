"""The collectives the reshard engines use, behind one interface, plus a counting wrapper.

all_gather and broadcast serve the colocated engines; `exchange` (a batch of point-to-point sends and
receives, all posted before any is waited on, so no order of peers can deadlock) serves the cross-pool
transfer (cross_pool_transfer.py), where the two sides are disjoint rank sets.

`TorchTransport` runs them on torch.distributed groups (gloo on CPU, NCCL on GPU; same code). A failed or
timed-out collective becomes `CollectiveError` naming the operation, the group family and its ranks,
so a dead peer is an error that says where, not a hang (groups get the timeout from ParallelConfig).
`CountingTransport` records, per group family, the calls and the bytes this rank received and sent:
tests and benchmarks assert volumes from these numbers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from hpcrl.distributed.groups import new_group


class CollectiveError(RuntimeError):
    """A collective failed or timed out; the message names the group."""


@dataclass(frozen=True)
class Group:
    """A process group with the name of its family (e.g. micro_data) and its global ranks."""

    family: str
    ranks: tuple[int, ...]
    handle: Any = field(default=None, compare=False, repr=False)
    """torch.distributed ProcessGroup (None for a size-1 group)."""

    def describe(self) -> str:
        return f"{self.family} group {list(self.ranks)}"


class Transport(Protocol):
    """`tag` names what is moved (e.g. the stream); counting transports tally by it."""

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, group: Group, tag: str = "") -> None:
        """output (flat, len(group)·input.numel()) <- every member's input, in member order."""

    def broadcast(self, tensor: torch.Tensor, src: int, group: Group, tag: str = "") -> None:
        """tensor on every member <- tensor of global rank `src`."""

    def exchange(
        self,
        sends: Sequence[tuple[torch.Tensor, int]],
        recvs: Sequence[tuple[torch.Tensor, int]],
        group: Group,
        tag: str = "",
    ) -> None:
        """Send each (tensor, global dst) and fill each (tensor, global src), all in flight at once;
        returns when all are complete. Peers call it with the matching halves."""


class TorchTransport:
    """torch.distributed collectives; errors name the group."""

    def __init__(self, timeout_s: float | None = None):
        self.timeout_s = timeout_s

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, group: Group, tag: str = "") -> None:
        import torch.distributed as dist

        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._run("all_gather", group, lambda: gather(output, input, group=group.handle))

    def broadcast(self, tensor: torch.Tensor, src: int, group: Group, tag: str = "") -> None:
        import torch.distributed as dist

        self._run("broadcast", group, lambda: dist.broadcast(tensor, src=src, group=group.handle))

    def exchange(
        self,
        sends: Sequence[tuple[torch.Tensor, int]],
        recvs: Sequence[tuple[torch.Tensor, int]],
        group: Group,
        tag: str = "",
    ) -> None:
        import torch.distributed as dist

        ops = [dist.P2POp(dist.isend, t, peer=dst, group=group.handle) for t, dst in sends]
        ops += [dist.P2POp(dist.irecv, t, peer=src, group=group.handle) for t, src in recvs]

        def run() -> None:
            # batch_isend_irecv: one NCCL group call (concurrent, no peer-order deadlock); isend/irecv on gloo
            for work in dist.batch_isend_irecv(ops) if ops else []:
                work.wait()

        self._run("exchange", group, run)

    def _run(self, op: str, group: Group, call) -> None:
        try:
            call()
        except (RuntimeError, ValueError) as err:  # gloo/NCCL timeouts and closed connections
            timeout = f" (collective timeout {self.timeout_s:g}s)" if self.timeout_s else ""
            raise CollectiveError(f"reshard {op} on {group.describe()} failed{timeout}: {err}") from err


@dataclass
class Tally:
    calls: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0


class CountingTransport:
    """Wraps a transport and counts every collective this rank takes part in, per group family."""

    def __init__(self, inner: Transport):
        self.inner = inner
        self.tallies: dict[str, Tally] = defaultdict(Tally)
        """Keyed "<tag>:<group family>" ("<family>" without a tag)."""

    @staticmethod
    def key(group: Group, tag: str) -> str:
        return f"{tag}:{group.family}" if tag else group.family

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, group: Group, tag: str = "") -> None:
        self.inner.all_gather(output, input, group, tag)
        tally = self.tallies[self.key(group, tag)]
        tally.calls += 1
        size = input.numel() * input.element_size()
        tally.bytes_received += output.numel() * output.element_size() - size
        tally.bytes_sent += size

    def broadcast(self, tensor: torch.Tensor, src: int, group: Group, tag: str = "") -> None:
        import torch.distributed as dist

        self.inner.broadcast(tensor, src, group, tag)
        tally = self.tallies[self.key(group, tag)]
        tally.calls += 1
        size = tensor.numel() * tensor.element_size()
        if dist.get_rank() == src:
            tally.bytes_sent += size
        else:
            tally.bytes_received += size

    def exchange(
        self,
        sends: Sequence[tuple[torch.Tensor, int]],
        recvs: Sequence[tuple[torch.Tensor, int]],
        group: Group,
        tag: str = "",
    ) -> None:
        self.inner.exchange(sends, recvs, group, tag)
        tally = self.tallies[self.key(group, tag)]
        tally.calls += 1
        tally.bytes_sent += sum(t.numel() * t.element_size() for t, _ in sends)
        tally.bytes_received += sum(t.numel() * t.element_size() for t, _ in recvs)

    def total(self, prefix: str = "") -> Tally:
        out = Tally()
        for key, tally in self.tallies.items():
            if key.startswith(prefix):
                out.calls += tally.calls
                out.bytes_received += tally.bytes_received
                out.bytes_sent += tally.bytes_sent
        return out

    def reset(self) -> None:
        self.tallies.clear()


def make_groups(
    layout, families: tuple[str, ...], timeout_s: float | None = None, cache: dict | None = None
) -> dict[str, Group]:
    """This rank's Group of each of `families` of `layout`.

    Collective: every rank of the world calls it with the same arguments, in the same order (torch's
    new_group rule). Size-1 groups get no process group (nothing to exchange). `cache` (rank tuple ->
    ProcessGroup) lets a sequence of layouts reuse groups; it must evolve identically on every rank.
    """
    import torch.distributed as dist

    cache = {} if cache is None else cache
    me = dist.get_rank()
    mine: dict[str, Group] = {}
    for family in families:
        for ranks in layout.all_groups()[family]:
            key = tuple(ranks)
            if len(key) > 1 and key not in cache:
                cache[key] = new_group(key, timeout_s)
            if me in key:
                mine[family] = Group(family, key, cache.get(key))
    return mine
