"""HF rollout engine: log-probs equal a teacher-forced forward, weights load by HF name, errors name tensors."""

import pytest
import torch

from hpcrl.data.tasks import ALPHABET
from hpcrl.data.tokenizer import build_char_tokenizer
from hpcrl.rollout.base import SamplingParams, left_pad, response_mask_from_eos
from hpcrl.rollout.config import RolloutConfig
from hpcrl.rollout.factory import build_rollout_engine, resolve_engine_name
from hpcrl.rollout.hf_engine import HFRolloutEngine, build_hf_causal_lm, token_logprobs
from hpcrl.train.config import ModelConfig

CFG = ModelConfig(
    vocab_size=32,
    hidden_size=32,
    num_layers=2,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=64,
    max_position_embeddings=32,
)
TOK = build_char_tokenizer(ALPHABET, vocab_size=32)
PROMPTS = [[1, 5, 6, 7, 15], [1, 8, 15], [1, 9, 9, 15]]


def _engine(seed=0, cfg=CFG):
    cfg = ModelConfig(**{**cfg.__dict__, "init_seed": seed})
    return HFRolloutEngine(build_hf_causal_lm(cfg), TOK.pad_token_id, TOK.eos_token_id, device="cpu")


def test_mask_and_left_padding_helpers():
    mask = response_mask_from_eos(torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 0, 0, 0]]), eos_id=2)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    ids, attn = left_pad([[3, 4], [5]], pad_id=0)
    assert ids.tolist() == [[3, 4], [0, 5]] and attn.tolist() == [[1, 1], [0, 1]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_a_teacher_forced_forward(temperature):
    engine = _engine()
    torch.manual_seed(1)
    out = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=temperature))
    assert out.response_ids_BT.shape == (3, 6) and out.logprobs_BT.shape == (3, 6)
    ids_BP, attn_BP = left_pad(PROMPTS, TOK.pad_token_id)
    full = torch.cat([ids_BP, out.response_ids_BT], dim=1)
    attn = torch.cat([attn_BP, out.response_mask_BT.long()], dim=1)
    with torch.no_grad():
        logits = engine.model(input_ids=full, attention_mask=attn).logits
    P = ids_BP.shape[1]
    expected = token_logprobs(logits[:, P - 1 : -1], out.response_ids_BT, temperature) * out.response_mask_BT
    torch.testing.assert_close(out.logprobs_BT, expected, atol=1e-5, rtol=1e-5)
    assert (out.logprobs_BT[out.response_mask_BT == 0] == 0).all()


def test_greedy_is_deterministic_and_eos_stops_rows():
    engine = _engine()
    greedy = SamplingParams(max_new_tokens=5).greedy()
    a, b = engine.generate(PROMPTS, greedy), engine.generate(PROMPTS, greedy)
    assert torch.equal(a.response_ids_BT, b.response_ids_BT)
    for row, mask in zip(a.response_ids_BT.tolist(), a.response_mask_BT.tolist(), strict=True):
        n = int(sum(mask))
        assert TOK.eos_token_id not in row[: n - 1] and all(t == TOK.pad_token_id for t in row[n:])


def test_load_weights_by_hf_name_changes_outputs_and_checks_names():
    engine, other = _engine(seed=0), _engine(seed=1)
    greedy = SamplingParams(max_new_tokens=6).greedy()
    before = engine.generate(PROMPTS, greedy).logprobs_BT
    n = engine.load_weights(other.model.state_dict().items())
    assert n == len(dict(other.model.named_parameters()))
    after = engine.generate(PROMPTS, greedy)
    torch.testing.assert_close(after.logprobs_BT, other.generate(PROMPTS, greedy).logprobs_BT)
    assert not torch.equal(before, after.logprobs_BT)
    with pytest.raises(KeyError, match="no parameter 'model.bogus'"):
        engine.load_weights([("model.bogus", torch.zeros(1))])
    with pytest.raises(ValueError, match=r"model.norm.weight: got shape \(3,\)"):
        engine.load_weights([("model.norm.weight", torch.zeros(3))])
    with pytest.raises(KeyError, match="were not sent"):
        engine.load_weights([("model.norm.weight", torch.ones(32))])


def test_tied_embeddings_accept_or_skip_lm_head():
    cfg = ModelConfig(**{**CFG.__dict__, "tie_word_embeddings": True})
    engine, other = _engine(0, cfg), _engine(1, cfg)
    assert engine.load_weights(other.model.state_dict().items()) == len(dict(other.model.named_parameters()))
    assert torch.equal(engine.model.lm_head.weight, other.model.model.embed_tokens.weight)


def test_auto_engine_is_hf_without_a_gpu():
    assert resolve_engine_name(RolloutConfig(engine="auto")) == "hf"
    engine = build_rollout_engine("hf", RolloutConfig(engine="hf"), CFG, TOK.pad_token_id, TOK.eos_token_id)
    assert isinstance(engine, HFRolloutEngine)
