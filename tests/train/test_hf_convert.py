"""Megatron <-> HF conversion: pure layout rules, config mapping, and logits parity against HF eager."""

import pytest
import torch

from hpcrl.errors import ConfigError
from hpcrl.train import hf_convert
from hpcrl.train.config import ModelConfig
from tests.train._rank_fns import random_full_state_dict, tiny_config


def test_merge_qkv_puts_each_kv_groups_query_heads_before_its_k_and_v():
    cfg = tiny_config(
        num_attention_heads=4, num_query_groups=2, hidden_size=8
    )  # head dim 2, 2 q heads per group
    q = torch.arange(8.0).repeat_interleave(1).reshape(8, 1)  # rows 0..7: heads 0..3, 2 rows each
    k = 100 + torch.arange(4.0).reshape(4, 1)
    v = 200 + torch.arange(4.0).reshape(4, 1)
    qkv = hf_convert.merge_qkv(q, k, v, cfg).flatten().tolist()
    assert qkv == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    q2, k2, v2 = hf_convert.split_qkv(hf_convert.merge_qkv(q, k, v, cfg), cfg)
    assert torch.equal(q2, q) and torch.equal(k2, k) and torch.equal(v2, v)


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_shards_round_trip_and_fc1_shards_hold_gate_then_up(tp):
    cfg = tiny_config(num_attention_heads=4, num_query_groups=4)
    full = random_full_state_dict(cfg, seed=1)
    for name, tensor in full.items():
        shards = [hf_convert.shard_for_tp(name, tensor, r, tp) for r in range(tp)]
        assert torch.equal(hf_convert.gather_tp_shards(name, shards), tensor), name
    fc1 = full["decoder.layers.0.mlp.linear_fc1.weight"]
    gate, up = fc1.chunk(2)
    shard = hf_convert.shard_for_tp("decoder.layers.0.mlp.linear_fc1.weight", fc1, 1, tp)
    assert torch.equal(shard, torch.cat([gate.chunk(tp)[1], up.chunk(tp)[1]]))
    assert hf_convert.tp_split_dim("decoder.layers.3.self_attention.linear_proj.weight") == 1
    assert hf_convert.tp_split_dim("decoder.final_layernorm.weight") is None


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("tie", [False, True])
def test_model_config_round_trips_through_the_hf_config(family, tie):
    cfg = tiny_config(family, tie_word_embeddings=tie, rope_theta=5000.0, rms_norm_eps=1e-5)
    hf_config = hf_convert.model_config_to_hf(cfg)
    assert type(hf_config).__name__ == {"llama": "LlamaConfig", "qwen2": "Qwen2Config"}[family]
    assert hf_convert.model_config_from_hf(hf_config) == cfg


def test_bad_family_bias_combinations_name_the_key():
    with pytest.raises(ConfigError, match=r"model\.qkv_bias.*qwen2 always has"):
        hf_convert.model_config_to_hf(ModelConfig(family="qwen2", qkv_bias=False))
    with pytest.raises(ConfigError, match=r"model\.qkv_bias"):
        hf_convert.model_config_to_hf(ModelConfig(family="llama", qkv_bias=True))


def test_hf_state_dict_missing_a_tensor_names_it():
    cfg = tiny_config()
    hf_sd = hf_convert.megatron_to_hf_state_dict(random_full_state_dict(cfg, seed=2), cfg)
    del hf_sd["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="model.layers.1.mlp.up_proj.weight"):
        hf_convert.hf_to_megatron_state_dict(hf_sd, cfg)


@pytest.mark.dist
def test_megatron_logits_equal_hf_eager_logits_with_every_parameter_random():
    from hpcrl.distributed.spawn import run_ranks
    from tests.train._rank_fns import hf_parity

    (result,) = run_ranks(hf_parity, 1)
    for key in ("llama", "llama_tied", "qwen2", "qwen2_tied"):
        assert result[key] <= 1e-5, (key, result[key])
        assert result[key + "_roundtrip_exact"] == 1.0, key
