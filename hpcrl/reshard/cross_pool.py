"""Pure cross-pool weight-transfer planner: training pool (p-t-d) -> disjoint rollout pool (p_g-t_g-d_r).

Split placement for asynchronous RL (verl's one-step-off-policy recipe, verl PR #2231; HybridFlow
EuroSys'25 §5 for the layouts): the actor trains on one pool and the rollout engine generates on another,
so after every update the new weights cross between two disjoint rank sets. Unlike the colocated
3D-HybridEngine (planner.py) no rank holds any part of its generation shard, so every element of it moves.

## API (the contract with the async driver; hpcrl/reshard/cross_pool_transfer.py executes it)
    plan = plan_cross_pool(metas, train=ParallelLayout(tensor=t, pipeline=p, data=d), train_ranks=[...],
                           gen=ParallelLayout(tensor=t_g, pipeline=p_g, data=d_r,
                                              rollout_tensor=t_g, rollout_pipeline=p_g), gen_ranks=[...])
    plan.sends(rank) / plan.receives(rank)   -> tuple[Message, ...] (pure data; global ranks)
    plan.receive_shapes(rank)                -> {name: generation-shard shape} of a receiver (to allocate)
    plan.bytes_bound(itemsize, rank=None)    -> receiver: its generation shard's bytes; sender: its even
                                                share rounded up; None: all bytes moved (sum over receivers)
`metas` come from `gpt_param_metas(model_cfg, pipeline=p)` (stages are training stages); `train_ranks[i]`
is the global rank of training-layout rank i, `gen_ranks[j]` of generation-layout rank j; disjoint.
Executor (cross_pool_transfer.py), as agreed, with these precisions of the contract's `groups=...`:
    xfer = CrossPoolTransfer.build(plan, rank, transport=None, timeout_s=None, dtype=None)
        # EVERY rank of the world calls it in the same order (one new_group over both pools + a barrier
        # among them); returns None on a rank in neither pool; transport defaults to
        # CountingTransport(TorchTransport()), tally family "cross_pool" (xfer.transport.total("cross_pool")).
        # The constructor CrossPoolTransfer(plan, rank, transport, group: Group) takes a ready Group.
    xfer.send(params) -> bytes sent
    xfer.receive(out) -> bytes received (= plan.bytes_bound(itemsize, rank))
    xfer.allocate(dtype, device) -> {name: empty generation-shard tensor} (e.g. the back buffer)
    xfer.rollout_weights(out, model_cfg) -> convert.RolloutWeights: `out` as (hf_name, tensor) pairs for an
        HF/vLLM engine's load_weights, exactly as the colocated hand-off (hpcrl/rl/handoff.py) gives them
    `dtype` = the wire dtype (None: the tensors' own; then both pools must hold the same dtype).

## Plan
Receiver j has generation coordinates (t_gj, p_gj, d_rj) = gen.rollout_coords(j); its shard is every
parameter with stage // b == p_gj (b = p / p_g, so p_g | p), TP shard t_gj of t_g (params.shard_of).
Along a split dim of size n (halves of n/2 each for GATE_UP, cut separately), training TP rank tp holds
[tp·n/t, (tp+1)·n/t) and the receiver needs [t_gj·n/t_g, (t_gj+1)·n/t_g); every non-empty intersection is
one *block* (a sub-tensor with the full extent on the other dims), read from training position (tp, stage)
and written into the generation shard. Any t, t_g work (t_g need not divide t). A replicated tensor (norm)
is held whole by every TP rank of its stage: position tp = (j + parameter index) mod t sends it.

Balance. Training position s = (tp, pp) (taken in training rank order, tp fastest) is held by the d
data-parallel replicas dp = 0..d-1. Its *stream* is the concatenation, receiver by receiver (generation
rank order), of the flattened blocks it owes them; length T_s. The stream is cut into d contiguous
ranges, replica k taking
    c_{s,k} = floor(T_s / d) + [ (k - o_s) mod d < T_s mod d ],   o_{s+1} = (o_s + T_s mod d) mod d,
so each sender rank sends <= ceil(T_s / d) elements (its even share rounded up), and since the remainders
go round-robin over positions, each replica in total sends <= ceil(sum_s T_s / d). A message is one
sender's range intersected with one receiver's part of the stream: at most one message per rank pair.

Volume. Receiver j receives exactly sum over its parameters of numel(shard at t_g) elements: its
generation shard, each element once (nothing is local across disjoint pools, so this is the lower bound).
Total moved = sum_j |generation shard_j| = d_r · M (the model is replicated d_r times over the rollout pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import ConfigError, Problem
from hpcrl.reshard.params import ParamMeta, Split


@dataclass(frozen=True)
class Block:
    """One rectangular part of one parameter: `shape` elements at `src_start` (training shard) and at
    `dst_start` (generation shard) along `dim`, full extent on every other dim (dim None: whole tensor)."""

    name: str
    dim: int | None
    src_start: int
    dst_start: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return _numel(self.shape)


@dataclass(frozen=True)
class Segment:
    """Flat elements [first, first + count) of `block` (row-major over block.shape)."""

    block: Block
    first: int
    count: int

    @property
    def whole(self) -> bool:
        return self.first == 0 and self.count == self.block.numel


@dataclass(frozen=True)
class Message:
    """What global rank `src` sends to global rank `dst`: its segments' elements, concatenated in order."""

    src: int
    dst: int
    segments: tuple[Segment, ...]

    @property
    def numel(self) -> int:
        return sum(s.count for s in self.segments)


@dataclass(frozen=True)
class CrossPoolPlan:
    """The whole transfer, identical on every rank of both pools (each rank reads its own part)."""

    train: ParallelLayout
    train_ranks: tuple[int, ...]
    gen: ParallelLayout
    gen_ranks: tuple[int, ...]
    metas: tuple[ParamMeta, ...]
    messages: tuple[Message, ...]
    """Every message, ordered by (position, replica, receiver)."""
    share_bounds: dict[int, int] = field(compare=False)
    """Sender global rank -> ceil(T_s / d) elements, its even share rounded up."""

    def sends(self, rank: int) -> tuple[Message, ...]:
        return tuple(m for m in self.messages if m.src == rank)

    def receives(self, rank: int) -> tuple[Message, ...]:
        return tuple(m for m in self.messages if m.dst == rank)

    def is_sender(self, rank: int) -> bool:
        return rank in self.train_ranks

    def is_receiver(self, rank: int) -> bool:
        return rank in self.gen_ranks

    def train_shapes(self, rank: int) -> dict[str, tuple[int, ...]]:
        """{name: training-shard shape} of the parameters held by sender `rank` (its stage)."""
        pp = self.train.train_coords(self.train_ranks.index(rank)).pipeline
        return {m.name: m.shard_shape(self.train.tensor) for m in self.metas if m.stage == pp}

    def receive_shapes(self, rank: int) -> dict[str, tuple[int, ...]]:
        """{name: generation-shard shape} of receiver `rank`, in metadata order (what `receive` fills)."""
        pg = self.gen.rollout_coords(self.gen_ranks.index(rank)).pipeline
        b = self.train.pipeline // self.gen.rollout_pipeline
        return {m.name: m.shard_shape(self.gen.rollout_tensor) for m in self.metas if m.stage // b == pg}

    def elements_bound(self, rank: int | None = None) -> int:
        """Elements: a receiver's generation shard, a sender's share bound, or (None) the total moved."""
        if rank is None:
            return sum(self.elements_bound(r) for r in self.gen_ranks)
        if self.is_receiver(rank):
            return sum(_numel(shape) for shape in self.receive_shapes(rank).values())
        if self.is_sender(rank):
            return self.share_bounds[rank]
        raise ValueError(f"rank {rank} is in neither pool")

    def bytes_bound(self, itemsize: int, rank: int | None = None) -> int:
        """`elements_bound(rank)` in bytes: what a receiver receives (exactly), what a sender may send
        at most, or the total moved."""
        return self.elements_bound(rank) * itemsize


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def check_pools(
    metas: Sequence[ParamMeta],
    train: ParallelLayout,
    train_ranks: Sequence[int],
    gen: ParallelLayout,
    gen_ranks: Sequence[int],
) -> None:
    """Every rule the inputs break, raised together as one ConfigError naming the key and the rule."""
    problems: list[Problem] = []
    for pool, layout, ranks in (("train_ranks", train, train_ranks), ("gen_ranks", gen, gen_ranks)):
        if len(ranks) != layout.world_size:
            problems.append(
                Problem(
                    f"{len(ranks)} ranks for a layout of {layout.world_size} ({layout.describe()})", key=pool
                )
            )
        if len(set(ranks)) != len(ranks) or any(not isinstance(r, int) or r < 0 for r in ranks):
            problems.append(
                Problem(f"ranks must be distinct non-negative integers, got {list(ranks)}", key=pool)
            )
    if set(train_ranks) & set(gen_ranks):
        problems.append(
            Problem(
                f"rule pools disjoint: ranks {sorted(set(train_ranks) & set(gen_ranks))} in both",
                key="gen_ranks",
            )
        )
    if (gen.tensor, gen.pipeline) != (gen.rollout_tensor, gen.rollout_pipeline):
        problems.append(
            Problem(
                f"the rollout pool has one layout: tensor/pipeline ({gen.tensor}, {gen.pipeline}) must equal "
                f"rollout_tensor/rollout_pipeline ({gen.rollout_tensor}, {gen.rollout_pipeline})",
                key="parallel.rollout_tensor",
            )
        )
    if train.pipeline % gen.rollout_pipeline:
        problems.append(
            Problem(
                f"rule p_g | p: rollout_pipeline={gen.rollout_pipeline} does not divide pipeline={train.pipeline}",
                key="parallel.rollout_pipeline",
            )
        )
    seen: set[str] = set()
    for meta in metas:
        if meta.name in seen:
            problems.append(Problem("parameter listed twice", key=meta.name))
        seen.add(meta.name)
        if not 0 <= meta.stage < train.pipeline:
            problems.append(Problem(f"stage {meta.stage} outside pipeline={train.pipeline}", key=meta.name))
        problems += meta.problems(train.tensor, gen.rollout_tensor)
    if problems:
        raise ConfigError(problems)


def blocks_between(meta: ParamMeta, tp: int, t: int, gtp: int, t_g: int) -> list[Block]:
    """Blocks of `meta` that training TP shard tp (of t) holds and generation TP shard gtp (of t_g) needs.

    Along the split dim each of the split's `parts` blocks (2 for GATE_UP = [gate; up], else 1) of size h is cut into
    contiguous chunks; shard i of c holds [i·h/c, (i+1)·h/c) of every half, stacked half after half."""
    dim = meta.split.dim
    if dim is None:
        return [Block(meta.name, None, 0, 0, meta.shape)]
    parts = meta.split.parts
    h = meta.shape[dim] // parts
    src_n, dst_n = h // t, h // t_g
    lo, hi = max(tp * src_n, gtp * dst_n), min((tp + 1) * src_n, (gtp + 1) * dst_n)
    if lo >= hi:
        return []
    out = []
    for part in range(parts):
        shape = list(meta.shape)
        shape[dim] = hi - lo
        src = part * src_n + lo - tp * src_n
        dst = part * dst_n + lo - gtp * dst_n
        out.append(Block(meta.name, dim, src, dst, tuple(shape)))
    return out


def _owed(
    metas: Sequence[ParamMeta], train: ParallelLayout, gen: ParallelLayout
) -> dict[tuple[int, int], list[tuple[int, list[Block]]]]:
    """Per training position (tp, pp): [(receiver local rank, its blocks from that position)] in order."""
    t, t_g, b = train.tensor, gen.rollout_tensor, train.pipeline // gen.rollout_pipeline
    owed: dict[tuple[int, int], list[tuple[int, list[Block]]]] = {
        (tp, pp): [] for pp in range(train.pipeline) for tp in range(t)
    }
    for j in range(gen.world_size):
        gtp, gpp, _, _ = gen.rollout_coords(j)
        per_position: dict[tuple[int, int], list[Block]] = {}
        for index, meta in enumerate(metas):
            if meta.stage // b != gpp:
                continue
            if meta.split is Split.REPLICATED:
                sources = [(j + index) % t]
            else:
                sources = list(range(t))
            for tp in sources:
                blocks = blocks_between(meta, tp, t, gtp, t_g)
                per_position.setdefault((tp, meta.stage), []).extend(blocks)
        for position, blocks in per_position.items():
            if blocks:
                owed[position].append((j, blocks))
    return owed


def _shares(total: int, d: int, offset: int) -> list[int]:
    """c_k = floor(total/d) + [(k - offset) mod d < total mod d] (see the module docstring)."""
    base, extra = divmod(total, d)
    return [base + ((k - offset) % d < extra) for k in range(d)]


def _cut(blocks: list[Block], lo: int, hi: int) -> list[Segment]:
    """The segments of the flattened concatenation of `blocks` that fall in [lo, hi)."""
    out, start = [], 0
    for block in blocks:
        end = start + block.numel
        first, last = max(lo, start), min(hi, end)
        if first < last:
            out.append(Segment(block, first - start, last - first))
        start = end
    return out


def plan_cross_pool(
    metas: Sequence[ParamMeta],
    *,
    train: ParallelLayout,
    train_ranks: Sequence[int],
    gen: ParallelLayout,
    gen_ranks: Sequence[int],
) -> CrossPoolPlan:
    """The cross-pool transfer plan (module docstring: blocks, balanced ranges, volumes). Pure and
    deterministic: every rank computes the same plan from the same arguments."""
    metas = tuple(metas)
    check_pools(metas, train, train_ranks, gen, gen_ranks)
    d, offset = train.data, 0
    messages: list[Message] = []
    share_bounds: dict[int, int] = {}
    for (tp, pp), receivers in _owed(metas, train, gen).items():
        total = sum(sum(block.numel for block in blocks) for _, blocks in receivers)
        shares = _shares(total, d, offset)
        offset = (offset + total % d) % d
        lo = 0
        for dp, share in enumerate(shares):
            src = train_ranks[train.train_rank(tp, pp, dp)]
            share_bounds[src] = -(-total // d)
            hi, start = lo + share, 0
            for j, blocks in receivers:
                length = sum(block.numel for block in blocks)
                first, last = max(lo, start), min(hi, start + length)
                if first < last:
                    segments = _cut(blocks, first - start, last - start)
                    messages.append(Message(src, gen_ranks[j], tuple(segments)))
                start += length
            lo = hi
    return CrossPoolPlan(
        train=train,
        train_ranks=tuple(train_ranks),
        gen=gen,
        gen_ranks=tuple(gen_ranks),
        metas=metas,
        messages=tuple(messages),
        share_bounds=share_bounds,
    )
