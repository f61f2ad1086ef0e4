"""The HybridFlow 3D-HybridEngine executor: runs a RankPlan over a Transport (EuroSys'25 §5.4).

train -> rollout (`to_generation`): for each stream, for each bucket, one all-gather over the rank's
micro-DP (or stage-merge) group into a staging buffer of one bucket, copied into per-member buffers;
the rank's own part is never copied into the generation buffers: its member slot *is* the training
storage (`TrainingStore`), so the generation shard = own training shards (in place) + received buffers.
Peak extra memory = M/(t_g·p_g) − M/(t·p) (received) + one staging bucket, zero redundancy (Table 2).
rollout -> train (`to_training`): the received buffers are released; training shards were never written.

Binding: `TrainingStore.bind` copies the rank's training parameters once into one flat tensor per stream
and points each parameter's `.data` at its view (as megatron's DDP param buffer does), so the all-gather
reads them in place and the optimizer keeps updating the same memory.

Shapes: flat buffers are 1-D element streams; generation tensors have their planner shapes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch

from hpcrl.errors import ConfigError, Problem
from hpcrl.reshard.planner import REPLICATED, SPLIT, GenTensor, RankPlan, StreamPlan
from hpcrl.reshard.transport import Group, Transport


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


class TrainingStore:
    """The rank's training shards, one flat tensor per stream; parameters are views into it."""

    def __init__(self, plan: RankPlan):
        self.plan = plan
        self.flat: dict[str, torch.Tensor] = {}

    def bind(self, params: Mapping[str, torch.Tensor]) -> None:
        """Move `params` (global name -> this rank's training shard) into the store, in place of their data."""
        expected = {e.name: e for s in self.plan.streams for e in s.entries}
        problems = [
            Problem("parameter not held by this rank in the plan", key=n) for n in params if n not in expected
        ]
        problems += [Problem(f"missing on rank {self.plan.rank}", key=n) for n in expected if n not in params]
        problems += [
            Problem(f"shape {tuple(params[n].shape)} != planned training shard {e.shape}", key=n)
            for n, e in expected.items()
            if n in params and tuple(params[n].shape) != e.shape
        ]
        dtypes = {p.dtype for p in params.values()}
        if len(dtypes) > 1:
            problems.append(
                Problem(f"mixed dtypes {sorted(map(str, dtypes))}: one dtype per model", key="params")
            )
        elif dtypes and next(iter(dtypes)).itemsize != self.plan.itemsize:
            problems.append(
                Problem(f"dtype {dtypes} does not match plan itemsize {self.plan.itemsize}", key="params")
            )
        if problems:
            raise ConfigError(problems)
        sample = next(iter(params.values()))
        for stream in self.plan.streams:
            flat = torch.empty(stream.lengths[stream.member], dtype=sample.dtype, device=sample.device)
            for entry in stream.entries:
                view = self._view(flat, entry.offset, entry.shape)
                view.copy_(params[entry.name].detach())
                params[entry.name].data = view
            self.flat[stream.name] = flat

    @staticmethod
    def _view(flat: torch.Tensor, offset: int, shape: tuple[int, ...]) -> torch.Tensor:
        n = 1
        for size in shape:
            n *= size
        return flat[offset : offset + n].view(shape)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The bound training shards by global name (views of the store)."""
        return {
            e.name: self._view(self.flat[s.name], e.offset, e.shape)
            for s in self.plan.streams
            for e in s.entries
        }


def assemble(gen: GenTensor, source, out: torch.Tensor | None = None) -> torch.Tensor:
    """Generation tensor from its pieces; `source(stream, member)` returns that member's flat stream.

    Without `out`, a tensor made of one whole piece is returned as a view (no copy); otherwise it is built
    in a new tensor. With `out` (shape `gen.shape`) every piece is copied into it and `out` is returned.
    """
    first = gen.pieces[0]
    flat = source(first.stream, first.member)
    if out is None and len(gen.pieces) == 1 and tuple(first.shape) == tuple(gen.shape):
        return flat[first.offset : first.offset + first.numel].view(gen.shape)
    if out is None:
        out = torch.empty(gen.shape, dtype=flat.dtype, device=flat.device)
    for piece in gen.pieces:
        flat = source(piece.stream, piece.member)
        part = flat[piece.offset : piece.offset + piece.numel].view(piece.shape)
        target = out if piece.dim is None else out.narrow(piece.dim, piece.start, piece.shape[piece.dim])
        target.copy_(part)
    return out


@dataclass
class GenerationShard:
    """This rank's generation shard: own training store (in place) + received member buffers."""

    plan: RankPlan
    store: TrainingStore
    received: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    released: bool = False

    def source(self, stream: str, member: int) -> torch.Tensor:
        if self.released:
            raise RuntimeError("generation shard was released (to_training); reshard again first")
        if member == self.plan.stream(stream).member:
            return self.store.flat[stream]
        return self.received[(stream, member)]

    def megatron_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(global Megatron name, generation-TP shard in Megatron layout) for every parameter of the
        rank's generation stage. Tensors are views where possible; don't keep them past `to_training`."""
        for gen in self.plan.gen:
            yield gen.name, assemble(gen, self.source)

    def received_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.received.values())


class ReshardEngine(Protocol):
    """What HybridEngine and the naive baseline share (benchmarks and the RL worker use only this)."""

    meter: BufferMeter

    def bind(self, params: Mapping[str, torch.Tensor]) -> None: ...

    def to_generation(self): ...

    def to_training(self, shard) -> None: ...


class HybridEngine:
    """Train <-> rollout resharding with the micro-DP all-gather; one instance per rank."""

    def __init__(
        self,
        plan: RankPlan,
        transport: Transport,
        groups: Mapping[str, Group],
        store: TrainingStore | None = None,
    ):
        """`store`: share the bound training shards of another engine of the same training layout (e.g. one
        engine per generation layout); its streams must be this plan's."""
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
        if store is not None and [s.entries for s in store.plan.streams] != [s.entries for s in plan.streams]:
            raise ConfigError("shared TrainingStore was planned for another training layout or model")
        self.store = store or TrainingStore(plan)
        self.meter = BufferMeter()
        self._staging: dict[str, torch.Tensor] = {}
        """`gather_into`'s staging buffers, kept between syncs until `release_staging` (a fresh buffer
        costs page faults inside the all-gather on CPU: 17 -> 26 ms for 20 MB, benchmarks/reshard_loop.py)."""

    def bind(self, params: Mapping[str, torch.Tensor]) -> None:
        self.store.bind(params)

    def to_generation(self) -> GenerationShard:
        """Gather the generation shard (collective over each micro-DP / stage-merge group)."""
        shard = GenerationShard(self.plan, self.store)
        for stream in self.plan.streams:
            self._receive(stream, shard)
        return shard

    def _receive(self, stream: StreamPlan, shard: GenerationShard) -> None:
        own = self.store.flat[stream.name]
        for member, length in enumerate(stream.lengths):
            if member != stream.member:
                shard.received[(stream.name, member)] = self.meter.alloc(length, own.dtype, own.device)
        for bucket in stream.buckets:
            self._exchange(stream, bucket, own, shard)

    def gather_into(self, sink) -> int:
        """train -> rollout straight into a GenerationStore (`sink`, hpcrl.reshard.generation); returns the
        generation tensors written. Same collectives and bytes as `to_generation`.

        A stream exchanged in one even bucket (every member's whole stream at once: the usual case up to
        `bucket_bytes`) all-gathers into one staging buffer with the rank's training shards as the input
        as they are, and the generation tensors are written from that buffer: no per-member received
        buffers, no copy of the own shard into staging. The staging buffer is kept for the next sync
        until `release_staging`. Peak extra memory = the store + one staging buffer of d_g·(own stream). Other streams (several buckets, unequal stages) take `to_generation`'s
        path for that stream, then are written and released.
        """
        sink.wake()
        written = 0
        for stream in self.plan.streams:
            own = self.store.flat[stream.name]
            if not stream.buckets:  # alone in its group: the generation tensors come from the own shard
                written += sink.fill_stream(stream.name, lambda member, own=own: own)
            elif len(stream.buckets) == 1 and stream.buckets[0].even:
                length = stream.lengths[0]
                staging = self._staging_for(stream.name, length * len(stream.ranks), own)
                self.transport.all_gather(staging, own, self.groups[stream.name], stream.name)
                written += sink.fill_stream(
                    stream.name,
                    lambda member, staging=staging, n=length: staging[member * n : (member + 1) * n],
                )
            else:
                shard = GenerationShard(self.plan, self.store)
                self._receive(stream, shard)
                written += sink.fill_stream(
                    stream.name, lambda member, s=shard, name=stream.name: s.source(name, member)
                )
                self.to_training(shard)
        return written

    def _exchange(self, stream: StreamPlan, bucket, own: torch.Tensor, shard: GenerationShard) -> None:
        group, start = self.groups[stream.name], bucket.start

        def member_slice(member: int) -> torch.Tensor:
            length = bucket.lengths[member]
            flat = own if member == stream.member else shard.received[(stream.name, member)]
            return flat[start : start + length]

        if bucket.even:
            length = bucket.lengths[0]
            staging = self.meter.alloc(length * len(stream.ranks), own.dtype, own.device)
            mine = staging[stream.member * length : (stream.member + 1) * length]
            mine.copy_(member_slice(stream.member))
            self.transport.all_gather(staging, mine, group, stream.name)
            for member in range(len(stream.ranks)):
                if member != stream.member:
                    member_slice(member).copy_(staging[member * length : (member + 1) * length])
            self.meter.free(staging)
            del staging, mine
            return
        for member, length in enumerate(bucket.lengths):  # unequal stages: no padding, one broadcast each
            if length:
                self.transport.broadcast(member_slice(member), stream.ranks[member], group, stream.name)

    def _staging_for(self, stream: str, numel: int, like: torch.Tensor) -> torch.Tensor:
        staging = self._staging.get(stream)
        if staging is None or staging.numel() != numel:
            staging = self._staging[stream] = self.meter.alloc(numel, like.dtype, like.device)
        return staging

    def release_staging(self) -> None:
        """Free `gather_into`'s staging buffers (with the generation store's sleep, between steps)."""
        for tensor in self._staging.values():
            self.meter.free(tensor)
        self._staging.clear()

    def to_training(self, shard: GenerationShard) -> None:
        """Release the received buffers; the training shards (store) were never written."""
        for tensor in shard.received.values():
            self.meter.free(tensor)
        shard.received.clear()
        shard.released = True


__all__ = [
    "SPLIT",
    "REPLICATED",
    "BufferMeter",
    "TrainingStore",
    "GenerationShard",
    "HybridEngine",
    "ReshardEngine",
    "assemble",
]
