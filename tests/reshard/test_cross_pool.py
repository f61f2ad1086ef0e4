"""Cross-pool transfer planner: property tests over random disjoint pools (<= 16 ranks) and random models.

Each receiver's generation shard is covered exactly once (an element counter), the bytes it receives equal
its generation shard (counted independently from the metas), every sender stays within its even share
rounded up (per training position and per data-parallel replica), the plan is deterministic, and the
executor's packing/unpacking, run in one process over an in-memory mailbox transport, reproduces the
independent reference slicer bit for bit. The multi-process gloo runs are in test_cross_pool_transfer.py.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import ConfigError
from hpcrl.reshard.convert import vllm_shard
from hpcrl.reshard.cross_pool import CrossPoolPlan, plan_cross_pool
from hpcrl.reshard.cross_pool_transfer import FAMILY, CrossPoolTransfer
from hpcrl.reshard.params import ParamMeta, Split, gpt_param_metas
from hpcrl.reshard.transport import CountingTransport, Group
from hpcrl.train import hf_convert
from hpcrl.train.config import ModelConfig
from tests.reshard._strategies import divisors, full_model, reference_shard


@st.composite
def pools(draw, max_world: int = 16) -> tuple[ParallelLayout, list[int], ParallelLayout, list[int]]:
    """A training layout and a generation layout (any t, t_g; p_g | p) on disjoint, shuffled global ranks."""
    t = draw(st.sampled_from([1, 2, 4]))
    p = draw(st.sampled_from([k for k in (1, 2, 4) if t * k < max_world]))
    d = draw(st.integers(1, max(1, (max_world - 1) // (t * p))))
    room = max_world - t * p * d
    t_g = draw(st.sampled_from([k for k in (1, 2, 3, 4) if k <= room]))
    p_g = draw(st.sampled_from([k for k in divisors(p) if t_g * k <= room]))
    d_r = draw(st.integers(1, room // (t_g * p_g)))
    train = ParallelLayout(tensor=t, pipeline=p, data=d)
    gen = ParallelLayout(tensor=t_g, pipeline=p_g, data=d_r, rollout_tensor=t_g, rollout_pipeline=p_g)
    ranks = draw(st.permutations(range(train.world_size + gen.world_size)))
    return train, list(ranks[: train.world_size]), gen, list(ranks[train.world_size :])


@st.composite
def cross_metas(draw, train: ParallelLayout, gen: ParallelLayout) -> list[ParamMeta]:
    """A random model cut by both t and t_g: vocab/column/QKV/GATE_UP/row/replicated on random stages."""
    t, t_g = train.tensor, gen.rollout_tensor
    u = math.lcm(t, t_g)
    metas = []
    for i in range(draw(st.integers(1, 7))):
        split = draw(st.sampled_from(list(Split)))
        stage = draw(st.integers(0, train.pipeline - 1))
        cols, k, groups = draw(st.integers(1, 3)), draw(st.integers(1, 2)), 0
        if split is Split.REPLICATED:
            shape = (draw(st.integers(1, 5)),) if draw(st.booleans()) else (draw(st.integers(1, 3)), cols)
        elif split is Split.ROW:
            shape = (draw(st.integers(1, 3)), u * k)
        elif split is Split.GATE_UP:
            shape = (2 * u * k, cols)
        elif split is Split.QKV:
            # whole kv groups per generation shard; megatron's rule: groups % t == 0 or t % groups == 0
            options = [u * k] + [g for g in divisors(t) if g % t_g == 0]
            groups = draw(st.sampled_from(options))
            rows = math.lcm(groups, u) * draw(st.integers(1, 3))
            shape = (rows, cols) if draw(st.booleans()) else (rows,)
        else:
            shape = (u * k, cols) if draw(st.booleans()) else (u * k,)
        metas.append(ParamMeta(f"p{i}.{split.value}", shape, split, stage, groups))
    return metas


@st.composite
def cases(draw):
    train, train_ranks, gen, gen_ranks = draw(pools())
    return draw(cross_metas(train, gen)), train, train_ranks, gen, gen_ranks


def _plan(case) -> CrossPoolPlan:
    metas, train, train_ranks, gen, gen_ranks = case
    return plan_cross_pool(metas, train=train, train_ranks=train_ranks, gen=gen, gen_ranks=gen_ranks)


def _generation_shard(
    metas, train: ParallelLayout, gen: ParallelLayout, j: int
) -> dict[str, tuple[int, ...]]:
    """Receiver j's generation shard shapes, written out independently of the planner."""
    b = train.pipeline // gen.pipeline
    gpp = (j // gen.tensor) % gen.pipeline
    shapes = {}
    for meta in metas:
        if meta.stage // b == gpp:
            shape = list(meta.shape)
            if meta.split is not Split.REPLICATED:
                shape[meta.split.dim] //= gen.tensor
            shapes[meta.name] = tuple(shape)
    return shapes


@settings(max_examples=150, deadline=None)
@given(cases())
def test_every_generation_element_exactly_once_and_bytes_equal_the_bound(case):
    metas, train, train_ranks, gen, gen_ranks = case
    plan = _plan(case)
    for j, rank in enumerate(gen_ranks):
        shapes = _generation_shard(metas, train, gen, j)
        assert plan.receive_shapes(rank) == shapes
        counters = {name: torch.zeros(shape, dtype=torch.int32) for name, shape in shapes.items()}
        for message in plan.receives(rank):
            assert message.src in train_ranks and message.dst == rank
            for seg in message.segments:
                block = seg.block
                hits = torch.zeros(block.numel, dtype=torch.int32)
                hits[seg.first : seg.first + seg.count] = 1
                counter = counters[block.name]
                if block.dim is not None:
                    counter = counter.narrow(block.dim, block.dst_start, block.shape[block.dim])
                counter += hits.view(block.shape)
        for name, counter in counters.items():
            assert bool((counter == 1).all()), f"receiver {rank}: {name} not covered exactly once"
        elements = sum(math.prod(shape) for shape in shapes.values())
        assert sum(m.numel for m in plan.receives(rank)) == elements == plan.elements_bound(rank)
        assert plan.bytes_bound(2, rank) == 2 * elements
    assert plan.elements_bound() == sum(m.numel for m in plan.messages)
    assert all(m.src in train_ranks and m.dst in gen_ranks for m in plan.messages)
    pairs = [(m.src, m.dst) for m in plan.messages]
    assert len(pairs) == len(set(pairs)), "at most one message per rank pair"


@settings(max_examples=150, deadline=None)
@given(cases())
def test_senders_stay_within_their_even_share_rounded_up(case):
    _, train, train_ranks, _, _ = case
    plan = _plan(case)
    sent = {rank: sum(m.numel for m in plan.sends(rank)) for rank in train_ranks}
    per_position: dict[tuple[int, int], list[int]] = defaultdict(list)
    per_replica: dict[int, int] = defaultdict(int)
    for i, rank in enumerate(train_ranks):
        tp, pp, dp = train.train_coords(i)
        per_position[(tp, pp)].append(sent[rank])
        per_replica[dp] += sent[rank]
    d = train.data
    for loads in per_position.values():
        total = sum(loads)
        assert max(loads) <= -(-total // d) and min(loads) >= total // d, loads
    for i, rank in enumerate(train_ranks):
        tp, pp, _ = train.train_coords(i)
        assert sent[rank] <= plan.elements_bound(rank) == -(-sum(per_position[(tp, pp)]) // d)
    total = sum(per_replica.values())
    assert max(per_replica.values()) <= -(-total // d), dict(per_replica)


@settings(max_examples=60, deadline=None)
@given(cases())
def test_planner_is_deterministic(case):
    metas, train, train_ranks, gen, gen_ranks = case
    first = _plan(case)
    again = plan_cross_pool(
        [ParamMeta(m.name, m.shape, m.split, m.stage, m.groups) for m in metas],
        train=ParallelLayout(tensor=train.tensor, pipeline=train.pipeline, data=train.data),
        train_ranks=tuple(train_ranks),
        gen=gen,
        gen_ranks=list(gen_ranks),
    )
    assert first == again
    assert first.share_bounds == again.share_bounds


class MailboxTransport:
    """In-process stand-in for the point-to-point exchange (one process plays every rank in turn:
    senders post into per-pair FIFO mailboxes, receivers take from them, in order, as point-to-point
    matching does). Only `exchange` exists: the transfer uses no other operation."""

    def __init__(self, mailbox: dict[tuple[int, int], list[torch.Tensor]], rank: int):
        self.mailbox, self.rank = mailbox, rank

    def exchange(self, sends, recvs, group, tag=""):
        for tensor, dst in sends:
            self.mailbox.setdefault((self.rank, dst), []).append(tensor.clone())
        for tensor, src in recvs:
            sent = self.mailbox[(src, self.rank)].pop(0)
            assert sent.shape == tensor.shape and sent.dtype == tensor.dtype
            tensor.copy_(sent)


def _run_in_memory(case, dtype=torch.float64, wire=None):
    """Every rank's send, then every receive, through CrossPoolTransfer over the mailbox. Returns
    ({receiver: out}, {rank: CountingTransport})."""
    metas, train, train_ranks, gen, gen_ranks = case
    plan = _plan(case)
    full = full_model(metas, dtype=dtype)
    mailbox: dict = {}
    group = Group(FAMILY, tuple(sorted(train_ranks + gen_ranks)))
    transports = {r: CountingTransport(MailboxTransport(mailbox, r)) for r in train_ranks + gen_ranks}
    for i, rank in enumerate(train_ranks):
        tp, pp, _ = train.train_coords(i)
        params = {
            m.name: reference_shard(full[m.name], m.split, tp, train.tensor).clone()
            for m in metas
            if m.stage == pp
        }
        xfer = CrossPoolTransfer(plan, rank, transports[rank], group, dtype=wire)
        assert xfer.send(params) == transports[rank].total(FAMILY).bytes_sent
    outs = {}
    for rank in gen_ranks:
        xfer = CrossPoolTransfer(plan, rank, transports[rank], group, dtype=wire)
        outs[rank] = {n: t.fill_(float("nan")) for n, t in xfer.allocate(dtype).items()}
        assert xfer.receive(outs[rank]) == transports[rank].total(FAMILY).bytes_received
    assert not any(mailbox.values()), "every message was received"
    return plan, full, outs, transports


@settings(max_examples=80, deadline=None)
@given(cases())
def test_executor_delivers_the_reference_generation_shard(case):
    metas, train, train_ranks, gen, gen_ranks = case
    plan, full, outs, transports = _run_in_memory(case)
    split = {m.name: m.split for m in metas}
    for j, rank in enumerate(gen_ranks):
        gtp = gen.rollout_coords(j).tensor
        for name, tensor in outs[rank].items():
            assert torch.equal(tensor, reference_shard(full[name], split[name], gtp, gen.tensor)), (
                rank,
                name,
            )
        assert transports[rank].total(FAMILY).bytes_received == plan.bytes_bound(8, rank)
    for rank in train_ranks:
        assert transports[rank].total(FAMILY).bytes_sent <= plan.bytes_bound(8, rank)


def test_wire_dtype_casts_on_both_sides():
    """fp32 training shards sent as fp64 arrive unchanged and count 8 bytes an element."""
    metas = [ParamMeta("w", (4, 3), Split.COLUMN, 0), ParamMeta("n", (3,), Split.REPLICATED, 0)]
    case = (metas, ParallelLayout(tensor=2), [0, 1], ParallelLayout(), [2])
    plan, full, outs, transports = _run_in_memory(case, dtype=torch.float32, wire=torch.float64)
    assert torch.equal(outs[2]["w"], full["w"]) and torch.equal(outs[2]["n"], full["n"])
    assert transports[2].total(FAMILY).bytes_received == plan.bytes_bound(8, 2) == 15 * 8


def test_replicas_split_one_receivers_stream_evenly():
    """t=1, d=3 -> one receiver: the 10 elements go 4/3/3 (round-robin remainder), never 10/0/0."""
    metas = [ParamMeta("w", (10,), Split.COLUMN, 0)]
    plan = plan_cross_pool(
        metas, train=ParallelLayout(data=3), train_ranks=[0, 1, 2], gen=ParallelLayout(), gen_ranks=[3]
    )
    assert [sum(m.numel for m in plan.sends(r)) for r in range(3)] == [4, 3, 3]
    assert [plan.bytes_bound(4, r) for r in range(3)] == [16, 16, 16]


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(train_ranks=[0, 1], gen_ranks=[1]), "gen_ranks"),  # overlapping pools
        (dict(train_ranks=[0], gen_ranks=[1]), "train_ranks"),  # 1 rank for a 2-rank layout
        (
            dict(gen=ParallelLayout(pipeline=2, rollout_pipeline=2), gen_ranks=[2, 3]),
            "parallel.rollout_pipeline",
        ),
        (dict(gen=ParallelLayout(tensor=2, rollout_tensor=1), gen_ranks=[2, 3]), "parallel.rollout_tensor"),
        (dict(gen=ParallelLayout(tensor=3, rollout_tensor=3), gen_ranks=[2, 3, 4]), "w"),  # 4 rows into 3
    ],
)
def test_bad_pools_raise_config_error_naming_the_key(kwargs, key):
    args = dict(train=ParallelLayout(tensor=2), train_ranks=[0, 1], gen=ParallelLayout(), gen_ranks=[2])
    args.update(kwargs)
    with pytest.raises(ConfigError) as err:
        plan_cross_pool([ParamMeta("w", (4, 3), Split.COLUMN, 0)], **args)
    assert key in str(err.value)


def test_received_shard_converts_to_what_vllm_loads_on_that_rollout_rank():
    """t=1,d=2 -> t_g=2 on shuffled ranks: each rollout rank's HF pairs equal vLLM's slicing of the full
    HF model for its own TP rank (the local generation rank, not the global one)."""
    cfg = ModelConfig(
        family="qwen2",
        qkv_bias=True,
        vocab_size=24,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=8,
        num_query_groups=2,
        ffn_hidden_size=12,
    )
    metas = gpt_param_metas(cfg)
    gen = ParallelLayout(tensor=2, rollout_tensor=2)
    case = (metas, ParallelLayout(data=2), [3, 0], gen, [2, 1])
    plan, full, outs, transports = _run_in_memory(case, dtype=torch.float32)
    full_hf = hf_convert.megatron_to_hf_state_dict(full, cfg)
    group = Group(FAMILY, (0, 1, 2, 3))
    for local, rank in enumerate([2, 1]):
        xfer = CrossPoolTransfer(plan, rank, transports[rank], group)
        items = list(xfer.rollout_weights(outs[rank], cfg))
        assert sorted(n for n, _ in items) == sorted(full_hf)
        for name, tensor in items:
            assert torch.equal(tensor, vllm_shard(name, full_hf[name], cfg, 2, local)), (rank, name)
