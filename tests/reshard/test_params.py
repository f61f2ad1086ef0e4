"""Parameter metadata (hpcrl.reshard.params): the split read off a megatron parameter's attributes and
its name, and the refusal of a held parameter whose attributes disagree with the plan. The same reading
on a real megatron-core model at t=2 is checked in tests/reshard/test_convert.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.reshard.params import ParamMeta, Split, gather_shards, shard_of, split_of, split_problems


def _param(shape, **attributes) -> torch.nn.Parameter:
    param = torch.nn.Parameter(torch.zeros(shape))
    for key, value in attributes.items():
        setattr(param, key, value)
    return param


TP = {"tensor_model_parallel": True}


@pytest.mark.parametrize(
    "name, attributes, split",
    [
        ("decoder.layers.0.input_layernorm.weight", {}, Split.REPLICATED),
        ("decoder.layers.0.mlp.linear_fc2.weight", {**TP, "partition_dim": 1}, Split.ROW),
        (
            "decoder.layers.0.mlp.linear_fc1.weight",
            {**TP, "partition_dim": 0, "partition_stride": 2},
            Split.GATE_UP,
        ),
        ("decoder.layers.0.self_attention.linear_qkv.bias", {**TP, "partition_dim": 0}, Split.QKV),
        ("embedding.word_embeddings.weight", {**TP, "partition_dim": 0}, Split.VOCAB),
        ("output_layer.weight", {**TP, "partition_dim": 0}, Split.VOCAB),
        (
            "decoder.layers.0.mlp.linear_fc1.weight",
            {**TP, "partition_dim": 0, "partition_stride": 1},
            Split.COLUMN,
        ),
        (
            "decoder.layers.0.adapter.weight",
            {"tensor_model_parallel": False, "partition_dim": 0},
            Split.REPLICATED,
        ),
    ],
)
def test_the_split_is_read_off_the_attributes_then_the_name(name, attributes, split):
    assert split_of(name, _param((4, 4), **attributes)) is split


def test_a_held_parameter_whose_attributes_disagree_with_the_plan_is_named():
    metas = [
        ParamMeta("decoder.layers.0.mlp.linear_fc1.weight", (8, 4), Split.GATE_UP, 0),
        ParamMeta("decoder.layers.0.mlp.linear_fc2.weight", (4, 4), Split.ROW, 0),
    ]
    params = {
        "decoder.layers.0.mlp.linear_fc1.weight": _param((4, 4), **TP, partition_dim=0, partition_stride=1),
        "decoder.layers.0.mlp.linear_fc2.weight": _param((4, 2), **TP, partition_dim=1),
    }
    [problem] = split_problems(metas, params)
    assert problem.key == "decoder.layers.0.mlp.linear_fc1.weight"
    assert "megatron's attributes say column" in problem.message and "the plan has gate_up" in problem.message
    plain = {name: torch.zeros(p.shape) for name, p in params.items()}  # no attributes to read: not checked
    assert split_problems(metas, plain) == []


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(list(Split)), st.sampled_from([1, 2, 4]), st.integers(1, 3))
def test_shards_of_every_split_gather_back_to_the_full_tensor(split, count, rows_per_chunk):
    size = split.parts * count * rows_per_chunk
    meta = ParamMeta("p", (size, size), split, 0, groups=count)
    full = torch.arange(size * size, dtype=torch.float32).reshape(size, size)
    shards = [shard_of(full, meta, index, count) for index in range(count)]
    assert all(s.shape == meta.shard_shape(count) for s in shards)
    assert torch.equal(gather_shards(shards, meta), full)
    if split is Split.GATE_UP:  # shard r = [gate chunk r; up chunk r]
        gate, up = full.chunk(2)
        assert torch.equal(shards[-1], torch.cat([gate.chunk(count)[-1], up.chunk(count)[-1]]))
