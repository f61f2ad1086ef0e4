import pytest

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import ConfigError
from hpcrl.reshard.build import build_reshard_engine
from hpcrl.reshard.engine import HybridEngine
from hpcrl.reshard.naive import NaiveEngine
from hpcrl.train.config import ModelConfig


def test_bad_model_for_the_layout_fails_before_any_group_is_needed():
    layout = ParallelLayout(tensor=4, pipeline=2, rollout_tensor=4)
    with pytest.raises(ConfigError) as err:
        build_reshard_engine(ModelConfig(vocab_size=30, num_layers=3), layout, rank=0, groups={})
    text = str(err.value)
    assert "model.vocab_size: rule vocab % t == 0" in text
    assert "model.num_layers: rule layers % p == 0" in text
    assert "parallel.rollout_tensor: rule kv_heads % t_g == 0" in text


def test_tied_embeddings_need_a_single_generation_stage():
    layout = ParallelLayout(pipeline=2, rollout_pipeline=2)
    with pytest.raises(ConfigError, match="tied embeddings need p_g = 1"):
        build_reshard_engine(ModelConfig(tie_word_embeddings=True), layout, rank=0, groups={})


def test_single_rank_engines_build_without_process_groups():
    layout = ParallelLayout()
    assert isinstance(build_reshard_engine(ModelConfig(), layout, rank=0, groups={}), HybridEngine)
    assert isinstance(
        build_reshard_engine(ModelConfig(), layout, rank=0, groups={}, kind="naive"), NaiveEngine
    )
