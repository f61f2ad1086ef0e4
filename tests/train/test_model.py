"""Pure checks of the model builder's layout rules (no process groups)."""

import pytest

from hpcrl.dist.layout import ParallelLayout
from hpcrl.train.model import train_coords, validate_layout
from tests.train._rank_fns import tiny_config


@pytest.mark.parametrize(("t", "p", "d"), [(2, 1, 2), (1, 2, 2), (2, 2, 2), (4, 2, 1), (1, 1, 3)])
def test_training_rank_order_is_parallel_layouts_tp_pp_dp(t, p, d):
    layout = ParallelLayout(tensor=t, pipeline=p, data=d)
    for rank in range(t * p * d):
        assert train_coords(rank, t, p) == tuple(layout.train_coords(rank))


def test_a_layout_that_does_not_fit_the_model_names_each_key():
    cfg = tiny_config(vocab_size=30, num_attention_heads=4, num_query_groups=2, num_layers=3)
    keys = {p.key for p in validate_layout(cfg, tensor=4, pipeline=2)}
    assert keys == {"model.vocab_size", "model.num_query_groups", "model.num_layers"}
    assert validate_layout(tiny_config(), tensor=2, pipeline=2) == []
