import pytest

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import ConfigError
from hpcrl.reshard.build import build_reshard_engine, model_param_metas
from hpcrl.reshard.engine import HybridEngine
from hpcrl.reshard.naive import NaiveEngine
from hpcrl.train.config import ModelConfig
from tests.reshard._strategies import full_model


def test_bad_model_for_the_layout_fails_before_any_group_is_needed():
    layout = ParallelLayout(tensor=4, pipeline=2, rollout_tensor=4)
    with pytest.raises(ConfigError) as err:
        build_reshard_engine(ModelConfig(vocab_size=30, num_layers=3), layout, {}, rank=0, groups={})
    text = str(err.value)
    assert "model.vocab_size: rule vocab % t == 0" in text
    assert "model.num_layers: rule layers % p == 0" in text
    assert "parallel.rollout_tensor: rule kv_heads % t_g == 0" in text


def test_tied_embeddings_need_a_single_generation_stage():
    layout = ParallelLayout(pipeline=2, rollout_pipeline=2)
    with pytest.raises(ConfigError, match="tied embeddings need p_g = 1"):
        build_reshard_engine(ModelConfig(tie_word_embeddings=True), layout, {}, rank=0, groups={})


def test_single_rank_engines_build_without_process_groups():
    layout, cfg = ParallelLayout(), ModelConfig()
    params = full_model(model_param_metas(cfg, 1), dtype=None)
    assert isinstance(build_reshard_engine(cfg, layout, params, rank=0, groups={}), HybridEngine)
    assert isinstance(build_reshard_engine(cfg, layout, params, rank=0, groups={}, kind="naive"), NaiveEngine)


def test_parameters_that_do_not_match_the_plan_are_named_at_build():
    """The engine reads the parameters it is given in place: every one must be planned, with the planned
    shape and dtype (an fp32 norm in a bf16 model is named, not resharded as bf16 bytes)."""
    cfg = ModelConfig(dtype="bfloat16")
    params = full_model(model_param_metas(cfg, 1), dtype=None)
    params["decoder.final_layernorm.weight"] = params["decoder.final_layernorm.weight"].float()
    params["decoder.layers.0.mlp.linear_fc2.weight"] = params["decoder.layers.0.mlp.linear_fc2.weight"][:, :2]
    params["extra.weight"] = params.pop("output_layer.weight")
    with pytest.raises(ConfigError) as err:
        build_reshard_engine(cfg, ParallelLayout(), params, rank=0, groups={})
    text = str(err.value)
    assert "decoder.final_layernorm.weight: dtype torch.float32 != planned bfloat16" in text
    assert "decoder.layers.0.mlp.linear_fc2.weight: shape" in text
    assert "extra.weight: parameter not held by this rank in the plan" in text
    assert "output_layer.weight: missing on rank 0" in text
