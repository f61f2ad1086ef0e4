"""Memory formulas against hand-computed values and their published forms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.plan import formulas as fm

# grpo_tiny's model: V=16, H=64, L=2, NH=4, NG=2 (head dim 16), FFN=128
TINY = fm.Dims(vocab=16, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128)


def test_layer_params_by_hand():
    # qkv (4 + 2*2)*16 rows x 64 = 8192; proj 64*64 = 4096; fc1 + fc2 = 3*128*64 = 24576; norms 2*64
    assert fm.layer_params(TINY, 1) == fm.StageParams(split=36864, replicated=128)
    assert fm.layer_params(TINY, 2) == fm.StageParams(split=18432, replicated=128)
    with_bias = fm.Dims(vocab=16, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, qkv_bias=True)
    assert fm.layer_params(with_bias, 1).split == 36864 + 128


def test_rank_params_by_hand():
    # p=1: 2 layers + embedding 16*64 + output 16*64; replicated 2*128 + final norm 64 = 76,096 (megatron's count)
    assert fm.rank_params(TINY, 1, 1) == fm.StageParams(split=75776, replicated=320)
    assert fm.rank_params(TINY, 1, 1).total == 76096
    # p=2: first stage 36864 + 1024 (+128); last stage 36864 + 1024 (+128 + 64): the last is larger
    assert fm.rank_params(TINY, 1, 2) == fm.StageParams(split=37888, replicated=192)
    tied = fm.Dims(vocab=16, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, tied=True)
    assert fm.rank_params(tied, 1, 1).split == 75776 - 1024  # one shared matrix at p = 1
    assert fm.rank_params(tied, 1, 2).split == 37888  # the last stage keeps its copy at p > 1
    # critic: scalar head (h, replicated) instead of the output layer
    assert fm.rank_params(TINY, 1, 1, value_head=True) == fm.StageParams(split=74752, replicated=384)


def test_korthikanti_published_form():
    # §4.1 at t = 1: s·b·h·(34 + 5as/h)
    s, b, h, a = 2048, 1, 12288, 96
    assert fm.korthikanti_layer_bytes(s, b, h, a) == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    # §4.2 with TP: 10 + 24/t + 5as/(ht)
    assert fm.korthikanti_layer_bytes(s, b, h, a, 8) == pytest.approx(
        s * b * h * (10 + 3 + 5 * a * s / (h * 8))
    )


def test_llama_layer_bytes_by_hand():
    # s=11, b=128: replicated 6·sbh = 540,672; split 4·sb·a·d = 360,448 + a·s²·b = 61,952 + 5·sbf = 901,120
    assert fm.llama_layer_bytes(TINY, 11, 128, 4) == 4 * (540672 + 360448 + 61952 + 901120)
    assert fm.llama_layer_bytes(TINY, 11, 128, 4, tensor=2) == 4 * (540672 + (360448 + 61952 + 901120) / 2)


def test_logits_kv_and_reshard_by_hand():
    assert fm.logits_bytes(TINY, 11, 128, 4) == 11 * 128 * 16 * 24
    # 2 (K,V) · 2 layers · 2 kv heads · 16 · 4 B · 128 seqs · 11 tokens
    assert (
        fm.kv_cache_bytes(TINY, sequences=128, tokens=11, e=4, rollout_tensor=1, rollout_pipeline=1) == 720896
    )
    # t_g = 4 > g = 2: kv heads replicate, one per rank
    assert (
        fm.kv_cache_bytes(TINY, sequences=1, tokens=1, e=2, rollout_tensor=4, rollout_pipeline=2)
        == 2 * 1 * 1 * 16 * 2
    )
    # DESIGN.md / HybridFlow: t=4,p=2 -> t_g=2,p_g=1 receives 3/8·M; t=8,p=4 -> t_g=8 receives 3/32·M
    assert fm.reshard_receive_bytes(800.0, 4, 2, 2, 1) == pytest.approx(300.0)
    assert fm.reshard_receive_bytes(3200.0, 8, 4, 8, 1) == pytest.approx(300.0)
    assert fm.reshard_receive_bytes(800.0, 4, 2, 4, 2) == 0.0


def test_optimizer_bytes():
    assert fm.optimizer_bytes_per_param("float32") == (8, 0)
    assert fm.optimizer_bytes_per_param("bfloat16") == (8, 4)
    assert fm.optimizer_bytes_per_param("float16") == (8, 4)


@settings(max_examples=60, deadline=None)
@given(
    kv=st.sampled_from([1, 2, 4, 8]),
    q_per_kv=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([8, 16, 64]),
    ffn_mult=st.integers(1, 8),
    layers_per_stage=st.integers(1, 4),
    tensor=st.sampled_from([1, 2, 4, 8]),
    pipeline=st.sampled_from([1, 2, 4]),
    tied=st.booleans(),
)
def test_tp_pp_split_properties(kv, q_per_kv, head_dim, ffn_mult, layers_per_stage, tensor, pipeline, tied):
    heads = kv * q_per_kv
    dims = fm.Dims(
        vocab=64 * 8,
        hidden=heads * head_dim,
        layers=layers_per_stage * pipeline,
        heads=heads,
        kv_heads=kv,
        ffn=8 * ffn_mult * 8,
        tied=tied,
    )
    full = fm.rank_params(dims, 1, 1)
    # TP splits every split tensor exactly; replicated ones stay whole
    assert fm.layer_params(dims, tensor).split * tensor == fm.layer_params(dims, 1).split
    assert fm.layer_params(dims, tensor).replicated == fm.layer_params(dims, 1).replicated
    # a rank never holds more than the whole model, and the sharded model (plus the tied copy at p > 1) is all of it
    rank = fm.rank_params(dims, tensor, pipeline)
    assert rank.total <= full.total + (dims.vocab * dims.hidden if tied and pipeline > 1 else 0)
    assert rank.split * tensor * pipeline >= full.split - (dims.vocab * dims.hidden if not tied else 0)
    # activations shrink (weakly) with TP; the split part exactly by t
    a1 = fm.llama_layer_bytes(dims, 16, 2, 2, 1)
    at = fm.llama_layer_bytes(dims, 16, 2, 2, tensor)
    repl = 2 * 6 * 16 * 2 * dims.hidden
    assert at <= a1
    assert (at - repl) * tensor == pytest.approx(a1 - repl)
