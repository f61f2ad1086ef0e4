import pytest
import torch

from hpcrl.distributed.spawn import run_ranks
from hpcrl.reshard.convert import hf_shard_to_megatron, megatron_shard_to_hf, vllm_shard
from hpcrl.reshard.params import gpt_param_metas, shard_of
from hpcrl.train import hf_convert
from hpcrl.train.config import ModelConfig
from tests.reshard._convert_rank_fns import gqa_config, logits_rank
from tests.reshard._strategies import full_model

_DIM1 = ("o_proj", "down_proj")


@pytest.mark.dist
@pytest.mark.slow
def test_logits_of_hf_model_loaded_from_handed_off_shards_match_megatron():
    """megatron GPTModel (GQA, SwiGLU, RoPE) trained 3 steps at t=2 -> reshard t_g=1 -> HF strict load."""
    cfg = gqa_config()
    results = run_ranks(logits_rank, 2)
    for rank, res in enumerate(results):
        assert res["trained"], "training steps must change the bound (in-store) weights"
        assert res["losses"][-1] < res["losses"][0]
        assert res["max_abs_diff"] < 1e-5, (rank, res["max_abs_diff"])
        assert res["inverse_ok"] and res["half_inverse_ok"]
        assert res["half_received"] == 0  # t_g = t: the generation shard is the training shard
    full = results[0]["hf_full"]
    assert all(torch.equal(full[k], results[1]["hf_full"][k]) for k in full)
    # t_g=2: the two HF shard halves concatenate to the full weights, sliced as vLLM slices them
    halves = [results[0]["hf_half"], results[1]["hf_half"]]
    assert set(halves[0]) == set(full)
    for name, tensor in full.items():
        for rank in (0, 1):
            assert torch.equal(halves[rank][name], vllm_shard(name, tensor, cfg, 2, rank)), (name, rank)
        if "norm" in name:
            assert torch.equal(halves[0][name], tensor) and torch.equal(halves[1][name], tensor)
        else:
            dim = 1 if name.rsplit(".", 2)[-2] in _DIM1 else 0
            assert torch.equal(torch.cat([halves[0][name], halves[1][name]], dim=dim), tensor), name
    assert [r["coords"][0] for r in results] == [0, 1]
    # the split read off megatron's parameters (attributes + name rules) is the planner's, on every rank
    planned = {m.name: m.split.value for m in gpt_param_metas(cfg, pipeline=1)}
    assert results[0]["splits"] == results[1]["splits"] == planned
    assert set(planned.values()) == {"vocab", "qkv", "row", "gate_up", "replicated"}


@pytest.mark.parametrize(("heads", "groups", "t_g"), [(8, 2, 2), (8, 4, 4), (4, 4, 2), (6, 3, 3)])
def test_per_shard_conversion_equals_vllm_slicing_of_the_full_hf_tensors(heads, groups, t_g):
    cfg = ModelConfig(
        family="qwen2",
        qkv_bias=True,
        vocab_size=24,
        hidden_size=heads * 4,
        num_layers=1,
        num_attention_heads=heads,
        num_query_groups=groups,
        ffn_hidden_size=12,
    )
    metas = gpt_param_metas(cfg)
    full = full_model(metas, dtype=torch.float32, seed=0)
    full_hf = hf_convert.megatron_to_hf_state_dict(full, cfg)
    for g in range(t_g):
        shard = {m.name: shard_of(full[m.name], m, g, t_g) for m in metas}
        hf_items = [pair for name, t in shard.items() for pair in megatron_shard_to_hf(name, t, cfg, t_g)]
        assert sorted(n for n, _ in hf_items) == sorted(full_hf)
        for name, tensor in hf_items:
            assert torch.equal(tensor, vllm_shard(name, full_hf[name], cfg, t_g, g)), (name, g)
        back = hf_shard_to_megatron(hf_items, shard, cfg, t_g)
        assert all(torch.equal(back[n], shard[n]) for n in shard)


def test_vllm_slicing_replicates_kv_heads_when_rollout_tp_exceeds_them():
    cfg = ModelConfig(
        vocab_size=16, hidden_size=16, num_attention_heads=4, num_query_groups=1, ffn_hidden_size=8
    )
    k = torch.arange(4 * 16, dtype=torch.float32).view(4, 16)  # one kv head of dim 4
    shards = [vllm_shard("model.layers.0.self_attn.k_proj.weight", k, cfg, 4, g) for g in range(4)]
    assert all(torch.equal(s, k) for s in shards)
    q = torch.arange(16 * 16, dtype=torch.float32).view(16, 16)
    assert torch.equal(vllm_shard("model.layers.0.self_attn.q_proj.weight", q, cfg, 4, 3), q[12:16])
