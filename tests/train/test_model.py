"""Pure checks of the model builder's layout rules (no process groups)."""

from hpcrl.train.model import validate_layout
from tests.train._rank_fns import tiny_config


def test_a_layout_that_does_not_fit_the_model_names_each_key():
    cfg = tiny_config(vocab_size=30, num_attention_heads=4, num_query_groups=2, num_layers=3)
    keys = {p.key for p in validate_layout(cfg, tensor=4, pipeline=2)}
    assert keys == {"model.vocab_size", "model.num_query_groups", "model.num_layers"}
    assert validate_layout(tiny_config(), tensor=2, pipeline=2) == []
