"""Executes a CrossPoolPlan over a Transport: training ranks send, rollout ranks receive (point-to-point).

Each rank posts all its messages at once through `Transport.exchange` (batched isend/irecv: one NCCL
group call on GPU, plain isend/irecv on gloo), so no order of peers can deadlock, and returns when its own
part is complete. A message goes as one point-to-point op per segment, in the plan's order on both sides,
so contiguous blocks are sent from and received into the tensors themselves, with no copy (both sides post
a pair's ops in the same order; point-to-point matches them in order, on gloo and NCCL). A receiver's
bytes are exactly its generation shard (`plan.bytes_bound(itemsize, rank)`); a sender's are at most its
even share of its training position's stream, rounded up (cross_pool.py).
Every byte goes through the transport, so a CountingTransport's tally under family "cross_pool" is the
volume (bytes_sent on senders, bytes_received on receivers). Source: verl one-step-off-policy recipe
(verl PR #2231), which broadcasts the full weights actor -> rollout; here each receiver gets only its shard.

Memory: only non-contiguous blocks (e.g. a row-parallel block cut along dim 1) and a wire dtype other
than the tensors' are staged: a sender copies such a block once, a receiver receives it into a staging
buffer and copies it into `out` after the exchange. Peak extra memory <= the rank's bytes moved, zero
when every block is contiguous. A sender's tensors must not change until `send` returns.

Usage (every rank of the world calls `build` in the same order, as torch.distributed.new_group requires):
    xfer = CrossPoolTransfer.build(plan, rank, CountingTransport(TorchTransport()))
    xfer.send(training_params)   # training ranks: {megatron name: this rank's training shard}
    xfer.receive(out)            # rollout ranks: {megatron name: generation-shard tensor}, filled in place
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

from hpcrl.distributed.groups import new_group
from hpcrl.reshard.convert import NamedShard, RolloutWeights, rollout_weights
from hpcrl.reshard.cross_pool import Block, CrossPoolPlan, Message
from hpcrl.reshard.transport import CountingTransport, Group, TorchTransport, Transport
from hpcrl.train.config import ModelConfig

FAMILY = "cross_pool"
"""Group family of the transfer (CountingTransport keys its tally by it)."""


def _view(tensor: torch.Tensor, block: Block, start: int) -> torch.Tensor:
    return tensor if block.dim is None else tensor.narrow(block.dim, start, block.shape[block.dim])


class CrossPoolTransfer:
    """One rank's side of the cross-pool transfer: `send` on training ranks, `receive` on rollout ranks.

    `dtype`: the element type on the wire (None: the tensors' own; both pools must then agree, since a
    receiver sizes its buffers by it). Senders cast to it, receivers cast from it into `out`."""

    def __init__(
        self,
        plan: CrossPoolPlan,
        rank: int,
        transport: Transport,
        group: Group,
        dtype: torch.dtype | None = None,
        tag: str = "",
    ):
        if not (plan.is_sender(rank) or plan.is_receiver(rank)):
            raise ValueError(f"rank {rank} is in neither pool of the cross-pool plan")
        self.plan, self.rank, self.transport, self.group = plan, rank, transport, group
        self.dtype, self.tag = dtype, tag
        self._sends: tuple[Message, ...] = plan.sends(rank)
        self._recvs: tuple[Message, ...] = plan.receives(rank)

    @classmethod
    def build(
        cls,
        plan: CrossPoolPlan,
        rank: int,
        transport: Transport | None = None,
        *,
        timeout_s: float | None = None,
        dtype: torch.dtype | None = None,
    ) -> CrossPoolTransfer | None:
        """Create the transfer's process group (both pools) and this rank's transfer; None for a rank in
        neither pool. Collective over the WHOLE world: every rank calls it, in the same order. The members
        meet at a barrier, so the group is initialised (NCCL's batched p2p wants that) and both pools
        are up."""
        ranks = tuple(sorted(plan.train_ranks + plan.gen_ranks))
        handle = new_group(ranks, timeout_s)
        if rank not in ranks:
            return None
        dist.barrier(group=handle)
        transport = transport or CountingTransport(TorchTransport(timeout_s))
        return cls(plan, rank, transport, Group(FAMILY, ranks, handle), dtype=dtype)

    # ---- training side -------------------------------------------------------------------------
    def send(self, params: Mapping[str, torch.Tensor]) -> int:
        """Send this training rank's part; `params` = {name: training shard}. Returns bytes sent."""
        if not self.plan.is_sender(self.rank):
            raise ValueError(f"rank {self.rank} is a rollout rank of the plan; it receives")
        self._check(params, self.plan.train_shapes(self.rank), "training")
        packed: dict[Block, torch.Tensor] = {}  # non-contiguous blocks, copied once
        sends = [
            (self._source(params, seg.block, packed)[seg.first : seg.first + seg.count], message.dst)
            for message in self._sends
            for seg in message.segments
        ]
        self.transport.exchange(sends, [], self.group, self.tag)
        return sum(t.numel() * t.element_size() for t, _ in sends)

    def _source(self, params: Mapping[str, torch.Tensor], block: Block, packed: dict) -> torch.Tensor:
        """The block's elements, flat: a view of the training shard when contiguous (zero copy)."""
        view = _view(params[block.name], block, block.src_start)
        if view.is_contiguous() and self.dtype in (None, view.dtype):
            return view.view(-1)
        if block not in packed:
            packed[block] = view.reshape(-1).to(self.dtype or view.dtype, copy=True)
        return packed[block]

    # ---- rollout side --------------------------------------------------------------------------
    def allocate(
        self, dtype: torch.dtype | None = None, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """Empty generation-shard tensors of this rollout rank, in metadata order (to receive into), each
        of `dtype`, or (None) of its parameter's own dtype (a bf16 model's fp32 norms stay fp32)."""
        shapes = self.plan.receive_shapes(self.rank)
        own = {m.name: getattr(torch, m.dtype) for m in self.plan.metas}
        return {
            name: torch.empty(shape, dtype=dtype or own[name], device=device)
            for name, shape in shapes.items()
        }

    def receive(self, out: Mapping[str, torch.Tensor]) -> int:
        """Fill `out` ({name: generation-shard tensor}) with this rollout rank's shard. Returns bytes
        received (= plan.bytes_bound(itemsize, rank)). `out` is written while the transfer is in flight:
        its contents are the new version only once this returns (the caller's double buffer)."""
        if not self.plan.is_receiver(self.rank):
            raise ValueError(f"rank {self.rank} is a training rank of the plan; it sends")
        self._check(out, self.plan.receive_shapes(self.rank), "generation")
        staged: dict[Block, torch.Tensor] = {}  # non-contiguous destinations (or another wire dtype)
        recvs = [
            (self._target(out, seg.block, staged)[seg.first : seg.first + seg.count], message.src)
            for message in self._recvs
            for seg in message.segments
        ]
        self.transport.exchange([], recvs, self.group, self.tag)
        for block, flat in staged.items():
            _view(out[block.name], block, block.dst_start).copy_(flat.view(block.shape))
        return sum(t.numel() * t.element_size() for t, _ in recvs)

    def _target(self, out: Mapping[str, torch.Tensor], block: Block, staged: dict) -> torch.Tensor:
        """Where the block's elements land, flat: a view of `out` when contiguous (zero copy), else a
        staging buffer copied into `out` after the exchange."""
        view = _view(out[block.name], block, block.dst_start)
        if view.is_contiguous() and self.dtype in (None, view.dtype):
            return view.view(-1)
        if block not in staged:
            staged[block] = torch.empty(block.numel, dtype=self.dtype or view.dtype, device=view.device)
        return staged[block]

    def rollout_weights(self, out: Mapping[str, torch.Tensor], model_cfg: ModelConfig) -> RolloutWeights:
        """`out` (a received generation shard) as HF/vLLM (name, tensor) pairs for this rollout rank's TP
        shard: the colocated hand-off's `rollout_weights`, at the rollout pool's layout and local rank."""
        local = self.plan.gen_ranks.index(self.rank)
        return rollout_weights(NamedShard(out), self.plan.gen, local, model_cfg)

    @staticmethod
    def _check(tensors: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]], kind: str) -> None:
        wrong = [
            f"{name}: want {shape}, got {tuple(tensors[name].shape) if name in tensors else 'missing'}"
            for name, shape in shapes.items()
            if name not in tensors or tuple(tensors[name].shape) != shape
        ]
        if wrong:
            raise ValueError(f"{kind} shards do not match the cross-pool plan: " + "; ".join(wrong))
