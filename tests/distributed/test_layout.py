import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.distributed.config import ParallelConfig
from hpcrl.distributed.layout import ParallelLayout, create_groups
from hpcrl.distributed.spawn import run_ranks
from hpcrl.errors import ConfigError
from hpcrl.train.config import ModelConfig


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@st.composite
def layouts(draw, max_world: int = 16) -> ParallelLayout:
    t = draw(st.sampled_from([1, 2, 4, 8]))
    p = draw(st.sampled_from([k for k in (1, 2, 4) if t * k <= max_world]))
    d = draw(st.sampled_from([k for k in (1, 2, 4) if t * p * k <= max_world]))
    return ParallelLayout(
        tensor=t,
        pipeline=p,
        data=d,
        rollout_tensor=draw(st.sampled_from(_divisors(t))),
        rollout_pipeline=draw(st.sampled_from(_divisors(p))),
    )


def test_design_example_t4_d2_to_tg2():
    layout = ParallelLayout(tensor=4, data=2, rollout_tensor=2)
    assert layout.micro_data == 2
    assert layout.rollout_tensor_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.micro_data_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.train_tensor_groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.rollout_data_groups() == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_training_rank_order_is_tp_then_pp_then_dp():
    layout = ParallelLayout(tensor=2, pipeline=2, data=2)
    assert [layout.train_coords(r) for r in (0, 1, 2, 5, 7)] == [
        (0, 0, 0),
        (1, 0, 0),
        (0, 1, 0),
        (1, 0, 1),
        (1, 1, 1),
    ]
    assert layout.train_pipeline_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.model_parallel_groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_pipeline_merge_t4_p2_to_tg2_pg1():
    layout = ParallelLayout(tensor=4, pipeline=2, rollout_tensor=2, rollout_pipeline=1)
    assert layout.micro_data == 4
    assert layout.micro_data_groups() == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert layout.rollout_tensor_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.stage_merge_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_every_family_partitions_the_world_and_coords_round_trip(layout):
    sizes = {
        "train_tensor": layout.tensor,
        "train_pipeline": layout.pipeline,
        "train_data": layout.data,
        "model_parallel": layout.model_parallel_size,
        "rollout_tensor": layout.rollout_tensor,
        "rollout_pipeline": layout.rollout_pipeline,
        "micro_data": layout.micro_data,
        "rollout_data": layout.rollout_data,
        "stage_merge": layout.stage_merge,
        "rollout_model_parallel": layout.rollout_tensor * layout.rollout_pipeline,
    }
    for family, groups in layout.all_groups().items():
        assert sorted(r for g in groups for r in g) == list(range(layout.world_size)), family
        assert {len(g) for g in groups} == {sizes[family]}, family
    for rank in range(layout.world_size):
        assert layout.train_rank(*layout.train_coords(rank)) == rank
        c = layout.rollout_coords(rank)
        assert layout.rollout_rank(c.tensor, c.pipeline, c.data) == rank


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_training_shard_is_contained_in_generation_shard(layout):
    """HybridFlow §5.3: the generation TP rank covers the training TP rank, same for PP stages."""
    a, b = layout.tensor_merge, layout.stage_merge
    for rank in range(layout.world_size):
        tp, pp, dp = layout.train_coords(rank)
        g = layout.rollout_coords(rank)
        assert g.tensor * a <= tp < (g.tensor + 1) * a
        assert g.pipeline * b <= pp < (g.pipeline + 1) * b
    for group in layout.micro_data_groups():  # consecutive along TP inside a stage
        assert all(group[i + 1] - group[i] == 1 for i in range(len(group) - 1) if (i + 1) % a)


def test_invalid_pairs_name_the_rule():
    with pytest.raises(
        ConfigError, match=r"t_g \| t.*parallel.rollout_tensor|parallel.rollout_tensor.*t_g \| t"
    ):
        ParallelLayout(tensor=4, rollout_tensor=3)
    with pytest.raises(ConfigError, match=r"p_g \| p"):
        ParallelLayout(pipeline=2, rollout_pipeline=4)
    with pytest.raises(ConfigError, match="world = tensor\\*pipeline\\*data"):
        ParallelLayout(tensor=2, data=2).check_world(8)
    with pytest.raises(ConfigError, match="positive integer"):
        ParallelLayout(tensor=0)


def test_model_rules_are_all_reported_at_once():
    model = ModelConfig(
        vocab_size=30, num_layers=3, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=128
    )
    with pytest.raises(ConfigError) as err:
        ParallelLayout(tensor=4, pipeline=2, rollout_tensor=4).check_model(model)
    text = str(err.value)
    assert "vocab % t" in text and "layers % p" in text and "kv_heads % t_g" in text
    assert "model.vocab_size" in text and "parallel.rollout_tensor" in text
    ParallelLayout(tensor=2, pipeline=1).check_model(ModelConfig())  # defaults fit t=2


def test_from_config():
    layout = ParallelLayout.from_config(ParallelConfig(tensor=2, data=2, rollout_tensor=1))
    assert (layout.world_size, layout.micro_data, layout.rollout_data) == (4, 2, 4)


def _groups_rank(rank: int, world_size: int) -> dict:
    import torch
    import torch.distributed as dist

    layout = ParallelLayout(tensor=2, pipeline=2, rollout_tensor=1, rollout_pipeline=1)
    groups = create_groups(layout, timeout_s=120)  # a guard: 4 ranks on a busy machine
    out = {}
    for family, group in groups.items():
        value = torch.tensor([float(rank)])
        dist.all_reduce(value, group=group)
        out[family] = value.item()
    return out


@pytest.mark.heavy
@pytest.mark.dist
def test_create_groups_all_reduce_sums_group_members():
    layout = ParallelLayout(tensor=2, pipeline=2, rollout_tensor=1, rollout_pipeline=1)
    results = run_ranks(_groups_rank, 4)
    for rank, sums in enumerate(results):
        for family in layout.all_groups():
            assert sums[family] == sum(layout.group_of(family, rank)), (rank, family)
