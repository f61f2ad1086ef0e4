import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import ConfigError
from hpcrl.reshard.engine import assemble
from hpcrl.reshard.params import ParamMeta, Split, gpt_param_metas, split_bytes_per_rank
from hpcrl.reshard.planner import SPLIT, plan_rank
from hpcrl.train.config import ModelConfig
from tests.reshard._strategies import full_model, layouts, metas_for, reference_shard


@st.composite
def layout_and_model(draw):
    layout = draw(layouts(max_world=16))
    return layout, draw(metas_for(layout)), draw(st.sampled_from([1, 8, 24, 1 << 20]))


def _streams_of_every_rank(layout, metas, plans):
    """What each rank holds: its training shards (reference slicing) laid out as its plan's entries say."""
    full = full_model(metas, dtype=None)
    split_of = {m.name: m.split for m in metas}
    held = {}
    for rank, plan in enumerate(plans):
        tp = layout.train_coords(rank).tensor
        held[rank] = {}
        for stream in plan.streams:
            parts = [
                reference_shard(full[e.name], split_of[e.name], tp, layout.tensor).reshape(-1)
                for e in stream.entries
            ]
            empty = torch.empty(0, dtype=getattr(torch, stream.dtype))
            held[rank][stream.name] = torch.cat(parts) if parts else empty
            assert [e.offset for e in stream.entries] == [
                sum(p.numel() for p in parts[:i]) for i in range(len(parts))
            ]
    return full, held


@settings(max_examples=100, deadline=None)
@given(layout_and_model())
def test_every_generation_element_is_covered_exactly_once_with_the_right_value(case):
    layout, metas, bucket_bytes = case
    plans = [plan_rank(layout, metas, r, bucket_bytes=bucket_bytes) for r in range(layout.world_size)]
    full, held = _streams_of_every_rank(layout, metas, plans)
    split_of = {m.name: m.split for m in metas}
    stage_of = {m.name: m.stage for m in metas}
    dtype_of = {m.name: m.dtype for m in metas}
    for rank, plan in enumerate(plans):
        g = layout.rollout_coords(rank)
        b = layout.stage_merge
        expected = [m.name for m in metas if m.stage // b == g.pipeline]
        assert [gen.name for gen in plan.gen] == expected
        for gen in plan.gen:
            coverage = torch.zeros(gen.shape, dtype=torch.int64)
            for piece in gen.pieces:
                target = (
                    coverage
                    if piece.dim is None
                    else coverage.narrow(piece.dim, piece.start, piece.shape[piece.dim])
                )
                assert tuple(target.shape) == piece.shape
                target += 1
            assert bool((coverage == 1).all()), (layout, gen.name)

            def piece_of(piece, plan=plan):
                flat = held[plan.stream(piece.stream).ranks[piece.member]][piece.stream]
                return flat[piece.offset : piece.offset + piece.numel].view(piece.shape)

            want = reference_shard(full[gen.name], split_of[gen.name], g.tensor, layout.rollout_tensor)
            got = assemble(gen, piece_of)
            assert got.dtype == want.dtype and torch.equal(got, want), (layout.describe(), rank, gen.name)
            assert stage_of[gen.name] // b == g.pipeline
            assert plan.stream(gen.stream).dtype == gen.dtype == dtype_of[gen.name]
        # received == the exact lower bound (what the generation shard needs and the rank lacks)
        assert plan.received_elements() == plan.lower_bound_elements()
        assert plan.received_bytes() == plan.lower_bound_bytes()
        # one stream per (kind, dtype) present in the model, the same on every rank
        kinds = {("replicated" if m.split is Split.REPLICATED else "split", m.dtype) for m in metas}
        assert {(s.kind, s.dtype) for s in plan.streams} == kinds


@settings(max_examples=100, deadline=None)
@given(layout_and_model())
def test_plans_agree_across_ranks(case):
    layout, metas, bucket_bytes = case
    plans = [plan_rank(layout, metas, r, bucket_bytes=bucket_bytes) for r in range(layout.world_size)]
    for rank, plan in enumerate(plans):
        for stream in plan.streams:
            assert stream.ranks[stream.member] == rank
            assert stream.lengths[stream.member] == sum(math.prod(e.shape) for e in stream.entries)
            for other in stream.ranks:
                assert plans[other].stream(stream.name).shared() == stream.shared()
            # buckets tile every member's stream exactly
            for member, length in enumerate(stream.lengths):
                if len(stream.ranks) > 1:
                    assert sum(bk.lengths[member] for bk in stream.buckets) == length
            chunk = max(1, bucket_bytes // (stream.itemsize * len(stream.ranks)))
            assert all(max(bk.lengths) <= chunk for bk in stream.buckets)


@pytest.mark.parametrize(
    ("t", "p", "t_g", "p_g"),
    [(4, 2, 2, 1), (2, 2, 1, 1), (4, 1, 2, 1), (1, 2, 1, 1), (8, 2, 8, 2), (8, 4, 8, 1), (4, 4, 1, 2)],
)
def test_split_volume_is_the_lower_bound_and_table2_formula(t, p, t_g, p_g):
    """Received = generation shard − own training shard (split params), computed from the metadata alone;
    = (d_g − 1)/(t·p)·M_split when stages hold equal bytes (p <= 2 for an untied GPT)."""
    model = ModelConfig(
        vocab_size=64,
        hidden_size=64,
        num_layers=4,
        num_attention_heads=8,
        num_query_groups=8,
        ffn_hidden_size=128,
    )
    layout = ParallelLayout(tensor=t, pipeline=p, rollout_tensor=t_g, rollout_pipeline=p_g)
    metas = [m for m in gpt_param_metas(model, pipeline=p)]
    split = [m for m in metas if m.split is not Split.REPLICATED]
    per_rank = split_bytes_per_rank(metas, t, p)
    assert (per_rank is not None) == (p <= 2)
    for rank in range(layout.world_size):
        plan = plan_rank(layout, metas, rank, bucket_bytes=4096)
        pp, gpp = layout.train_coords(rank).pipeline, layout.rollout_coords(rank).pipeline
        gen = sum(m.shard_numel(t_g) for m in split if m.stage // layout.stage_merge == gpp)
        own = sum(m.shard_numel(t) for m in split if m.stage == pp)
        assert plan.received_elements(SPLIT) == gen - own
        if per_rank is not None:
            assert plan.received_elements(SPLIT) * 4 == (layout.micro_data - 1) * per_rank


def test_bad_model_is_rejected_before_any_collective_naming_parameter_and_rule():
    layout = ParallelLayout(tensor=2, rollout_tensor=2)
    metas = [
        ParamMeta("embedding.word_embeddings.weight", (33, 8), Split.VOCAB, 0),
        ParamMeta("decoder.layers.0.self_attention.linear_qkv.weight", (24, 8), Split.QKV, 0, groups=1),
        ParamMeta("decoder.layers.0.mlp.linear_fc1.weight", (6, 8), Split.GATE_UP, 0),
        ParamMeta("decoder.layers.1.input_layernorm.weight", (8,), Split.REPLICATED, 3),
    ]
    with pytest.raises(ConfigError) as err:
        plan_rank(layout, metas, 0, bucket_bytes=1024)
    text = str(err.value)
    assert "embedding.word_embeddings.weight: rule shape[0] % tp == 0" in text
    assert "linear_qkv.weight: rule kv_heads % t_g == 0" in text
    assert "linear_fc1.weight: rule shape[0] % 2·tp == 0" in text
    assert "input_layernorm.weight: stage 3 outside pipeline=1" in text


def test_gpt_metas_cover_a_tied_pipeline_model():
    model = ModelConfig(tie_word_embeddings=True, qkv_bias=True, family="qwen2")
    names = [m.name for m in gpt_param_metas(model, pipeline=1)]
    assert "output_layer.weight" not in names and "decoder.layers.1.self_attention.linear_qkv.bias" in names
    staged = {m.name: m.stage for m in gpt_param_metas(model, pipeline=2)}
    assert "output_layer.weight" not in staged and staged["decoder.final_layernorm.weight"] == 1
    assert (
        staged["decoder.layers.0.input_layernorm.weight"] == 0
        and staged["decoder.layers.1.mlp.linear_fc1.weight"] == 1
    )
