"""The HybridFlow 3D-HybridEngine executor: runs a RankPlan over a Transport (EuroSys'25 §5.4).

train -> rollout (`to_generation`): for each stream, for each bucket, one all-gather over the rank's
micro-DP (or stage-merge) group into a staging buffer of one bucket, copied into per-member buffers;
the rank's own part is never copied into the generation buffers: its pieces are read in place from the
live training parameters (`TrainingShards`), so the generation shard = own training shards (in place) +
received buffers. Peak extra memory = M/(t_g·p_g) − M/(t·p) (received) + one staging bucket, zero
redundancy (Table 2). rollout -> train (`to_training`): the received buffers are released; training
shards were never written.

One owner of the weights: the update step (hpcrl.train.update) owns the parameters' storage and the
engine only reads it, through each parameter's current `.data`, at every transition (`attach` keeps the
parameters, never repoints them). `verify(written)` checks, per parameter, that what the last transition
read equals what the optimizer wrote (its own view of the weights: megatron's DDP param buffer).

Shapes: flat buffers are 1-D element streams; generation tensors have their planner shapes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch

from hpcrl.errors import ConfigError, Problem
from hpcrl.reshard.params import dtype_name
from hpcrl.reshard.planner import REPLICATED, SPLIT, Entry, GenTensor, Piece, RankPlan, StreamPlan
from hpcrl.reshard.transport import Group, Transport

PieceSource = Callable[[Piece], torch.Tensor]
"""A piece of some member's stream, as a tensor of the piece's shape (a view where possible)."""


class WeightSyncMismatch(RuntimeError):
    """What a transition read differs from what the optimizer wrote; the message names the parameter."""


@dataclass
class BufferMeter:
    """Bytes of the buffers an engine allocates beyond the training shards: live and peak."""

    live: int = 0
    peak: int = 0

    def alloc(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        tensor = torch.empty(numel, dtype=dtype, device=device)
        self.live += tensor.numel() * tensor.element_size()
        self.peak = max(self.peak, self.live)
        return tensor

    def track(self, tensor: torch.Tensor) -> torch.Tensor:
        """Account a tensor allocated elsewhere (e.g. by torch.cat)."""
        self.live += tensor.numel() * tensor.element_size()
        self.peak = max(self.peak, self.live)
        return tensor

    def free(self, tensor: torch.Tensor) -> None:
        self.live -= tensor.numel() * tensor.element_size()


class TrainingShards:
    """The rank's training shards, read as the plan's streams straight from the live parameters.

    The update step owns the parameters' storage (torch: each parameter; megatron: DDP's contiguous
    param buffer, which the distributed optimizer steps and all-gathers into). This class never copies
    them ahead of time and never repoints `.data`: every read takes each parameter's current `.data`, so
    the rollout receives exactly what the optimizer last wrote, whatever layout its backend chose (as
    megatron-core's own resharding reads the model's parameters in place). A stream is the virtual
    concatenation of its entries in plan order; `read` copies a range of it, `piece` returns a view.
    """

    def __init__(self, plan: RankPlan):
        self.plan = plan
        self.params: dict[str, torch.Tensor] = {}
        self.entries = {s.name: tuple(sorted(s.entries, key=lambda e: e.offset)) for s in plan.streams}
        self._starts = {name: [e.offset for e in entries] for name, entries in self.entries.items()}

    def attach(self, params: Mapping[str, torch.Tensor]) -> None:
        """Read from `params` (global name -> this rank's training shard) from now on: every planned
        entry once, with its planned shape and dtype (ConfigError naming each one that is not)."""
        expected = {e.name: (e, s.dtype) for s in self.plan.streams for e in s.entries}
        problems = [
            Problem("parameter not held by this rank in the plan", key=n) for n in params if n not in expected
        ]
        problems += [Problem(f"missing on rank {self.plan.rank}", key=n) for n in expected if n not in params]
        for name, (entry, dtype) in expected.items():
            if name not in params:
                continue
            shape = tuple(params[name].shape)
            if shape != entry.shape:
                problems.append(Problem(f"shape {shape} != planned training shard {entry.shape}", key=name))
            if dtype_name(params[name].dtype) != dtype:
                problems.append(Problem(f"dtype {params[name].dtype} != planned {dtype}", key=name))
        if problems:
            raise ConfigError(problems)
        self.params = dict(params)

    def flat(self, name: str) -> torch.Tensor:
        """Parameter `name` as it is now, flattened (a view of the optimizer's storage)."""
        return self.params[name].detach().reshape(-1)

    def read(self, stream: str, start: int, out: torch.Tensor) -> torch.Tensor:
        """Copy elements [start, start + out.numel()) of this rank's `stream` into `out` (1-D)."""
        stop = start + out.numel()
        for entry in self.entries[stream]:
            first, last = max(start, entry.offset), min(stop, entry.offset + math.prod(entry.shape))
            if first < last:
                part = self.flat(entry.name)[first - entry.offset : last - entry.offset]
                out[first - start : last - start].copy_(part)
        return out

    def piece(self, piece: Piece) -> torch.Tensor:
        """The rank's own `piece` as a view of the live parameter that holds it."""
        index = bisect.bisect_right(self._starts[piece.stream], piece.offset) - 1
        entry = self.entries[piece.stream][index]
        begin = piece.offset - entry.offset
        return self.flat(entry.name)[begin : begin + piece.numel].view(piece.shape)

    def sums(self, stream: str, flat: torch.Tensor | None = None) -> torch.Tensor:
        """Per-entry checksums (`entry_sums`) of `stream` as `flat` holds it (a buffer with the stream as
        a transition read it), or of the parameters now when `flat` is None."""
        if flat is None:
            return entry_sums(self.entries[stream], lambda e: self.flat(e.name))
        return entry_sums(self.entries[stream], lambda e: flat[e.offset : e.offset + math.prod(e.shape)])


def entry_sums(entries, tensor_of: Callable[[Entry], torch.Tensor]) -> torch.Tensor:
    """The float64 sum of each entry's tensor (`tensor_of(entry)`), as one vector: the checksum that
    `HybridEngine.verify` compares (the differing element names the parameter)."""
    sums = [tensor_of(e).reshape(-1).double().sum() for e in entries]
    return torch.stack(sums) if sums else torch.zeros(0, dtype=torch.float64)


def assemble(gen: GenTensor, piece_of: PieceSource, out: torch.Tensor | None = None) -> torch.Tensor:
    """Generation tensor from its pieces (`piece_of(piece)`: the piece's elements, shaped).

    Without `out`, a tensor made of one whole piece is returned as that piece (a view, no copy);
    otherwise it is built in a new tensor. With `out` (shape `gen.shape`) every piece is copied into it.
    """
    first = gen.pieces[0]
    part = piece_of(first)
    if out is None and len(gen.pieces) == 1 and tuple(first.shape) == tuple(gen.shape):
        return part
    if out is None:
        out = torch.empty(gen.shape, dtype=part.dtype, device=part.device)
    for piece in gen.pieces:
        target = out if piece.dim is None else out.narrow(piece.dim, piece.start, piece.shape[piece.dim])
        target.copy_(piece_of(piece))
    return out


@dataclass
class GenerationShard:
    """This rank's generation shard: own training shards (in place) + received member buffers."""

    plan: RankPlan
    shards: TrainingShards
    received: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    released: bool = False

    def piece(self, piece: Piece) -> torch.Tensor:
        if self.released:
            raise RuntimeError("generation shard was released (to_training); reshard again first")
        if piece.member == self.plan.stream(piece.stream).member:
            return self.shards.piece(piece)
        flat = self.received[(piece.stream, piece.member)]
        return flat[piece.offset : piece.offset + piece.numel].view(piece.shape)

    def megatron_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(global Megatron name, generation-TP shard in Megatron layout) for every parameter of the
        rank's generation stage. Tensors are views where possible (of the training parameters, too):
        read them, don't write them or keep them past `to_training`."""
        for gen in self.plan.gen:
            yield gen.name, assemble(gen, self.piece)

    def received_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.received.values())


class ReshardEngine(Protocol):
    """What HybridEngine and the naive baseline share (benchmarks and the RL worker use only this)."""

    meter: BufferMeter

    def attach(self, params: Mapping[str, torch.Tensor]) -> None: ...

    def to_generation(self): ...

    def to_training(self, shard) -> None: ...


class HybridEngine:
    """Train <-> rollout resharding with the micro-DP all-gather; one instance per rank."""

    def __init__(
        self,
        plan: RankPlan,
        transport: Transport,
        groups: Mapping[str, Group],
        shards: TrainingShards | None = None,
    ):
        """`shards`: read the training shards another engine of the same training layout has attached
        (e.g. one engine per generation layout); its streams must be this plan's."""
        self.plan, self.transport = plan, transport
        self.groups = {}
        for stream in plan.streams:
            group = groups.get(stream.family) if len(stream.ranks) > 1 else Group(stream.family, stream.ranks)
            if group is None or tuple(group.ranks) != stream.ranks:
                raise ConfigError(
                    f"{stream.family} group of rank {plan.rank} must be {list(stream.ranks)}, "
                    f"got {None if group is None else list(group.ranks)}"
                )
            self.groups[stream.name] = group
        if shards is not None and [s.entries for s in shards.plan.streams] != [
            s.entries for s in plan.streams
        ]:
            raise ConfigError("shared TrainingShards were planned for another training layout or model")
        self.shards = shards or TrainingShards(plan)
        self.meter = BufferMeter()
        self.record_reads = False
        """When True, each transition keeps per-parameter checksums of what it read (for `verify`)."""
        self._read_sums: dict[str, torch.Tensor] = {}
        self._staging: dict[str, torch.Tensor] = {}
        """`gather_into`'s staging buffers, kept between syncs until `release_staging` (a fresh buffer
        costs page faults inside the all-gather on CPU: 17 -> 26 ms for 20 MB, benchmarks/reshard_loop.py)."""

    def attach(self, params: Mapping[str, torch.Tensor]) -> None:
        """Read the training shards from `params` (global name -> this rank's shard; see TrainingShards)."""
        self.shards.attach(params)

    def _device(self) -> torch.device:
        return next(iter(self.shards.params.values())).device

    def _record(self, stream: StreamPlan, flat: torch.Tensor | None = None) -> None:
        if self.record_reads:
            self._read_sums[stream.name] = self.shards.sums(stream.name, flat)

    def to_generation(self) -> GenerationShard:
        """Gather the generation shard (collective over each micro-DP / stage-merge group)."""
        shard = GenerationShard(self.plan, self.shards)
        for stream in self.plan.streams:
            self._receive(stream, shard)
            self._record(stream)
        return shard

    def _receive(self, stream: StreamPlan, shard: GenerationShard) -> None:
        dtype = getattr(torch, stream.dtype)
        for member, length in enumerate(stream.lengths):
            if member != stream.member:
                shard.received[(stream.name, member)] = self.meter.alloc(length, dtype, self._device())
        for bucket in stream.buckets:
            self._exchange(stream, bucket, shard)

    def gather_into(self, sink) -> int:
        """train -> rollout straight into a GenerationStore (`sink`, hpcrl.reshard.generation); returns the
        generation tensors written. Same collectives and bytes as `to_generation`.

        A stream exchanged in one even bucket (every member's whole stream at once: the usual case up to
        `bucket_bytes`) is read from the parameters into the rank's slot of one staging buffer, all-gathered
        in place, and the generation tensors are written from that buffer: no per-member received buffers.
        The staging buffer is kept for the next sync until `release_staging`. Peak extra memory = the
        store + one staging buffer of d_g·(own stream). A stream alone in its group is written from the
        parameters directly. Other streams (several buckets, unequal stages) take `to_generation`'s path
        for that stream, then are written and released.
        """
        sink.wake()
        written = 0
        for stream in self.plan.streams:
            if not stream.buckets:  # alone in its group: the generation tensors come from the own shards
                written += sink.fill_stream(stream.name, self.shards.piece)
                self._record(stream)
            elif len(stream.buckets) == 1 and stream.buckets[0].even:
                written += self._gather_even(stream, sink)
            else:
                shard = GenerationShard(self.plan, self.shards)
                self._receive(stream, shard)
                written += sink.fill_stream(stream.name, shard.piece)
                self._record(stream)
                self.to_training(shard)
        return written

    def _gather_even(self, stream: StreamPlan, sink) -> int:
        """One all-gather of every member's whole stream into staging, then the sink's tensors from it."""
        n = stream.lengths[0]
        staging = self._staging_for(stream, n * len(stream.ranks))
        mine = self.shards.read(stream.name, 0, staging[stream.member * n : (stream.member + 1) * n])
        self._record(stream, mine)
        self.transport.all_gather(staging, mine, self.groups[stream.name], stream.name)

        def piece_of(piece: Piece) -> torch.Tensor:
            begin = piece.member * n + piece.offset
            return staging[begin : begin + piece.numel].view(piece.shape)

        return sink.fill_stream(stream.name, piece_of)

    def _exchange(self, stream: StreamPlan, bucket, shard: GenerationShard) -> None:
        group, start = self.groups[stream.name], bucket.start

        def member_slice(member: int) -> torch.Tensor:
            length = bucket.lengths[member]
            return shard.received[(stream.name, member)][start : start + length]

        dtype, device = getattr(torch, stream.dtype), self._device()
        if bucket.even:
            length = bucket.lengths[0]
            staging = self.meter.alloc(length * len(stream.ranks), dtype, device)
            mine = staging[stream.member * length : (stream.member + 1) * length]
            self.shards.read(stream.name, start, mine)
            self.transport.all_gather(staging, mine, group, stream.name)
            for member in range(len(stream.ranks)):
                if member != stream.member:
                    member_slice(member).copy_(staging[member * length : (member + 1) * length])
            self.meter.free(staging)
            return
        for member, length in enumerate(bucket.lengths):  # unequal stages: no padding, one broadcast each
            if not length:
                continue
            if member == stream.member:
                own = self.shards.read(stream.name, start, self.meter.alloc(length, dtype, device))
                self.transport.broadcast(own, stream.ranks[member], group, stream.name)
                self.meter.free(own)
            else:
                self.transport.broadcast(member_slice(member), stream.ranks[member], group, stream.name)

    def _staging_for(self, stream: StreamPlan, numel: int) -> torch.Tensor:
        staging = self._staging.get(stream.name)
        if staging is None or staging.numel() != numel:
            dtype = getattr(torch, stream.dtype)
            staging = self._staging[stream.name] = self.meter.alloc(numel, dtype, self._device())
        return staging

    def release_staging(self) -> None:
        """Free `gather_into`'s staging buffers (with the generation store's sleep, between steps)."""
        for tensor in self._staging.values():
            self.meter.free(tensor)
        self._staging.clear()

    def to_training(self, shard: GenerationShard) -> None:
        """Release the received buffers; the training shards were never written."""
        for tensor in shard.received.values():
            self.meter.free(tensor)
        shard.received.clear()
        shard.released = True

    def read_checksum(self) -> float:
        """The sum of the last transition's recorded per-parameter checksums (needs `record_reads`): a
        figure that changes whenever the weights the rollout received change."""
        return float(sum(float(sums.sum()) for sums in self._read_sums.values()))

    def verify(self, written: Mapping[str, torch.Tensor]) -> int:
        """Check that the last transition read, parameter by parameter, what `written` holds (global name
        -> the weights as the optimizer wrote them, e.g. megatron DDP's param buffer). Needs
        `record_reads`; returns the parameters checked; raises WeightSyncMismatch naming the first
        parameter whose checksum differs."""
        if not self._read_sums:
            raise RuntimeError("nothing recorded: set record_reads before the transition")
        checked = 0
        for stream in self.plan.streams:
            entries = self.shards.entries[stream.name]
            expected = entry_sums(entries, lambda e: written[e.name])
            read = self._read_sums[stream.name]
            if not torch.equal(expected, read):
                bad = int((expected != read).nonzero()[0])
                raise WeightSyncMismatch(
                    f"rank {self.plan.rank}: the reshard read {entries[bad].name} with checksum "
                    f"{float(read[bad])!r}, but the optimizer wrote {float(expected[bad])!r}: the rollout would "
                    "not get the trained weights"
                )
            checked += len(entries)
        return checked


__all__ = [
    "SPLIT",
    "REPLICATED",
    "BufferMeter",
    "TrainingShards",
    "GenerationShard",
    "HybridEngine",
    "ReshardEngine",
    "WeightSyncMismatch",
    "assemble",
    "entry_sums",
]
