"""Pure reshard planner (HybridFlow 3D-HybridEngine, EuroSys'25 §5.3–5.4): no process group needed.

Input: a ParallelLayout, the model's ParamMetas (each with its dtype), the bucket size. Output for one rank:
- its *streams*: the flat concatenation (in metadata order) of the training shards it holds, one stream per
  (kind, dtype). Two kinds: "split" (TP-split parameters) is exchanged over the rank's micro-DP group
  (size d_g = a·b); "replicated" (norms, whole on every TP rank) over its stage-merge group (size
  b = p/p_g), because only the merged pipeline stages' copies are missing. A mixed-precision model (bf16
  matrices beside fp32 norms or routers) has one stream per dtype of each kind, named "<kind>.<dtype>":
  no element is ever converted on the way, so the rollout receives the trainer's exact bits, and each
  stream's bytes meet the bound on their own (a stream exists when any parameter of the model has its
  kind and dtype, so every rank plans the same streams).
- the buckets of each stream: bucket k holds elements [k·c, (k+1)·c) of every member's stream, c = per-member
  chunk = bucket_bytes / (stream itemsize · group size). Equal member lengths -> one all-gather per bucket; unequal
  (stages of different size) -> one broadcast per member that has data, so nothing is ever padded.
- its generation tensors: for every parameter of its generation stage, the pieces (member, stream offset,
  shape) and where each lands in the generation tensor (dim, start). The rank's own pieces are "kept":
  they are read in place from its training shards.

Volume (Table 2): a rank receives exactly the elements of its generation shard it does not hold,
sum over other members of their stream lengths = (d_g−1)/(t·p)·M_split for the split stream when stages
are balanced; the replicated stream adds the (b−1) other stages' norms. That is the lower bound, since the
training shard is contained in the generation shard (gen_tp = tp // a, gen_pp = pp // b).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import ConfigError, Problem
from hpcrl.reshard.params import ITEMSIZE, ParamMeta, Split

SPLIT, REPLICATED = "split", "replicated"
KINDS = (SPLIT, REPLICATED)
_KIND_GROUP = {SPLIT: "micro_data", REPLICATED: "stage_merge"}


def stream_name(kind: str, dtype: str) -> str:
    """The stream of `kind`'s parameters of one dtype, e.g. "split.bfloat16" (also the transport tag)."""
    return f"{kind}.{dtype}"


def _kind_of(meta: ParamMeta) -> str:
    return REPLICATED if meta.split is Split.REPLICATED else SPLIT


@dataclass(frozen=True)
class Piece:
    """Elements [offset, offset + numel(shape)) of `member`'s `stream`, viewed as `shape`, land in
    generation_tensor.narrow(dim, start, shape[dim]) (the whole tensor when dim is None)."""

    stream: str
    member: int
    offset: int
    shape: tuple[int, ...]
    dim: int | None
    start: int

    @property
    def numel(self) -> int:
        return _numel(self.shape)


@dataclass(frozen=True)
class GenTensor:
    """One parameter of the rank's generation shard (all its pieces come from one stream)."""

    name: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]
    dtype: str

    @property
    def stream(self) -> str:
        return self.pieces[0].stream


@dataclass(frozen=True)
class Entry:
    """Where a training shard of this rank sits in its stream."""

    name: str
    offset: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Bucket:
    """Elements [start, start + lengths[m]) of each member m's stream."""

    start: int
    lengths: tuple[int, ...]

    @property
    def even(self) -> bool:
        return len(set(self.lengths)) == 1


@dataclass(frozen=True)
class StreamPlan:
    """One stream of one rank: identical on every member except `member` and `entries`."""

    name: str
    kind: str
    """SPLIT or REPLICATED."""
    dtype: str
    """torch dtype name of every element (e.g. "bfloat16")."""
    family: str
    """ParallelLayout group family it is exchanged over."""
    ranks: tuple[int, ...]
    member: int
    lengths: tuple[int, ...]
    buckets: tuple[Bucket, ...]
    entries: tuple[Entry, ...]
    """This rank's training shards in the stream, in order."""

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    def shared(self) -> tuple:
        """The part every member must agree on."""
        return (self.name, self.dtype, self.family, self.ranks, self.lengths, self.buckets)


@dataclass(frozen=True)
class RankPlan:
    layout: ParallelLayout
    rank: int
    bucket_bytes: int
    streams: tuple[StreamPlan, ...]
    gen: tuple[GenTensor, ...]

    def stream(self, name: str) -> StreamPlan:
        return next(s for s in self.streams if s.name == name)

    def streams_of(self, kind: str | None = None) -> tuple[StreamPlan, ...]:
        """This rank's streams of `kind` (every stream when None)."""
        return tuple(s for s in self.streams if kind in (None, s.kind))

    def received_elements(self, kind: str | None = None) -> int:
        """Elements this rank receives in one transition (streams of `kind`, or all)."""
        return sum(
            length for s in self.streams_of(kind) for m, length in enumerate(s.lengths) if m != s.member
        )

    def received_bytes(self, kind: str | None = None) -> int:
        """Bytes this rank receives in one transition: each stream's elements at its own itemsize."""
        return sum(
            length * s.itemsize
            for s in self.streams_of(kind)
            for m, length in enumerate(s.lengths)
            if m != s.member
        )

    def lower_bound_bytes(self, kind: str | None = None) -> int:
        """Bytes of the generation shard not held locally, counted from the generation side (the bound)."""
        return sum(
            p.numel * ITEMSIZE[g.dtype]
            for g in self.gen
            for p in g.pieces
            if kind in (None, self.stream(p.stream).kind) and p.member != self.stream(p.stream).member
        )

    def lower_bound_elements(self, kind: str | None = None) -> int:
        """Elements of the generation shard not held locally, counted from the generation side."""
        return sum(
            p.numel
            for g in self.gen
            for p in g.pieces
            if kind in (None, self.stream(p.stream).kind) and p.member != self.stream(p.stream).member
        )

    def generation_elements(self) -> int:
        return sum(_numel(g.shape) for g in self.gen)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def check_inputs(layout: ParallelLayout, metas: list[ParamMeta], bucket_bytes: int) -> None:
    """Every rule the inputs break, raised together as one ConfigError naming parameter and rule."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for meta in metas:
        if meta.name in seen:
            problems.append(Problem("parameter listed twice", key=meta.name))
        seen.add(meta.name)
        if not 0 <= meta.stage < layout.pipeline:
            problems.append(Problem(f"stage {meta.stage} outside pipeline={layout.pipeline}", key=meta.name))
        problems += meta.problems(layout.tensor, layout.rollout_tensor)
        if meta.dtype not in ITEMSIZE:
            problems.append(Problem(f"dtype {meta.dtype!r} is not one of {sorted(ITEMSIZE)}", key=meta.name))
    if bucket_bytes < 1:
        problems.append(Problem(f"bucket_bytes must be >= 1, got {bucket_bytes}", key="bucket_bytes"))
    if problems:
        raise ConfigError(problems)


def stream_keys(metas: list[ParamMeta]) -> tuple[tuple[str, str], ...]:
    """(kind, dtype) of every stream of the model, in plan order: kinds in KINDS order, dtypes sorted."""
    present = {(_kind_of(m), m.dtype) for m in metas}
    return tuple(sorted(present, key=lambda key: (KINDS.index(key[0]), key[1])))


def _stage_streams(layout: ParallelLayout, metas: list[ParamMeta]) -> dict[int, dict[str, dict[str, Entry]]]:
    """Per training stage: each stream's entries {name: Entry}; a member's stream depends only on its stage."""
    names = [stream_name(*key) for key in stream_keys(metas)]
    out: dict[int, dict[str, dict[str, Entry]]] = {}
    for stage in range(layout.pipeline):
        offsets = dict.fromkeys(names, 0)
        streams: dict[str, dict[str, Entry]] = {name: {} for name in names}
        for meta in metas:
            if meta.stage != stage:
                continue
            stream = stream_name(_kind_of(meta), meta.dtype)
            shape = meta.shard_shape(layout.tensor)
            streams[stream][meta.name] = Entry(meta.name, offsets[stream], shape)
            offsets[stream] += _numel(shape)
        out[stage] = streams
    return out


def _stream_length(entries: dict[str, Entry]) -> int:
    return sum(_numel(e.shape) for e in entries.values())


def _buckets(lengths: tuple[int, ...], chunk: int) -> tuple[Bucket, ...]:
    if len(lengths) == 1:
        return ()  # nothing to exchange with oneself
    longest = max(lengths)
    return tuple(
        Bucket(start, tuple(max(0, min(chunk, length - start)) for length in lengths))
        for start in range(0, longest, chunk)
    )


def _pieces(meta: ParamMeta, layout: ParallelLayout, offset: int, j: int, member: int) -> list[Piece]:
    """Pieces of training TP shard j (of the a merged into one generation shard) of a split parameter."""
    stream = stream_name(SPLIT, meta.dtype)
    shape = meta.shard_shape(layout.tensor)
    dim, parts = meta.split.dim, meta.split.parts
    block = shape[dim] // parts  # one block's chunk in the training shard
    gen_block = meta.shard_shape(layout.rollout_tensor)[dim] // parts
    piece_shape = (*shape[:dim], block, *shape[dim + 1 :])
    return [
        Piece(
            stream,
            member,
            offset + part * _numel(piece_shape),
            piece_shape,
            dim,
            part * gen_block + j * block,
        )
        for part in range(parts)
    ]


def plan_rank(layout: ParallelLayout, metas: list[ParamMeta], rank: int, *, bucket_bytes: int) -> RankPlan:
    """The reshard plan of `rank` (HybridFlow micro-DP all-gather; see module docstring)."""
    check_inputs(layout, metas, bucket_bytes)
    stage_streams = _stage_streams(layout, metas)
    _, pp, _ = layout.train_coords(rank)
    a, b = layout.tensor_merge, layout.stage_merge
    streams = []
    for kind, dtype in stream_keys(metas):
        name, family = stream_name(kind, dtype), _KIND_GROUP[kind]
        ranks = tuple(layout.group_of(family, rank))
        lengths = tuple(_stream_length(stage_streams[layout.train_coords(r).pipeline][name]) for r in ranks)
        chunk = max(1, bucket_bytes // (ITEMSIZE[dtype] * len(ranks)))
        streams.append(
            StreamPlan(
                name=name,
                kind=kind,
                dtype=dtype,
                family=family,
                ranks=ranks,
                member=ranks.index(rank),
                lengths=lengths,
                buckets=_buckets(lengths, chunk),
                entries=tuple(stage_streams[pp][name].values()),
            )
        )
    gen_stage = pp // b
    gen = []
    for meta in metas:
        if meta.stage // b != gen_stage:
            continue
        stream = stream_name(_kind_of(meta), meta.dtype)
        entry = stage_streams[meta.stage][stream][meta.name]
        if meta.split is Split.REPLICATED:
            member = meta.stage % b  # stage-merge groups are ordered by pipeline stage
            pieces = [Piece(stream, member, entry.offset, meta.shape, None, 0)]
        else:
            pieces = [
                piece
                for j in range(a)  # micro-DP member of training tp (tp // a)·a + j at this stage
                for piece in _pieces(meta, layout, entry.offset, j, j + a * (meta.stage % b))
            ]
        gen.append(GenTensor(meta.name, meta.shard_shape(layout.rollout_tensor), tuple(pieces), meta.dtype))
    return RankPlan(
        layout=layout,
        rank=rank,
        bucket_bytes=bucket_bytes,
        streams=tuple(streams),
        gen=tuple(gen),
    )
