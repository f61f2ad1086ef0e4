"""Sampling of the megatron engine: truncation, the log-prob contract, and per-row seeds that make the
samples independent of how a batch is split over generation replicas."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.rollout.base import SamplingParams, counter_hash, gumbel_noise, row_seeds
from hpcrl.rollout.megatron_engine import filter_logits, sample_tokens


def test_top_k_and_top_p_keep_the_hand_computed_sets():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    assert torch.isfinite(filter_logits(logits, 2, 1.0)).tolist() == [[True, True, False, False, False]]
    # top-p 0.8: 0.5 + 0.2 = 0.7 < 0.8, so 0.15 is needed too; 0.85 >= 0.8 stops there
    assert torch.isfinite(filter_logits(logits, 0, 0.8)).tolist() == [[True, True, True, False, False]]
    # top-p smaller than the first token's mass still keeps that token
    assert torch.isfinite(filter_logits(logits, 0, 0.1)).tolist() == [[True, False, False, False, False]]
    assert torch.equal(filter_logits(logits, 0, 1.0), logits)
    # even a degenerate top-p (rejected at expand, rules.py) never empties the set: argmax, not token 0
    flat = torch.tensor([[0.1, 0.3, 5.0, 0.2]])
    assert torch.isfinite(filter_logits(flat, 0, 0.0)).tolist() == [[False, False, True, False]]


def test_greedy_and_logprob_contract():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.5, 0.1, 0.2]])
    tokens, logp = sample_tokens(logits, SamplingParams(max_new_tokens=1, temperature=0.0))
    assert tokens.tolist() == [1, 0]
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1))
    # sampled at temperature 0.7: log-probs of softmax(logits / 0.7), not of the truncated distribution
    sampling = SamplingParams(max_new_tokens=1, temperature=0.7, top_k=1)
    tokens, logp = sample_tokens(logits, sampling, torch.tensor(row_seeds(1, 0, 2)))
    assert tokens.tolist() == [1, 0]  # top-k 1 leaves only the argmax
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, tokens[:, None]).squeeze(-1)
    torch.testing.assert_close(logp, expected)


def test_seeded_gumbel_max_samples_the_softmax():
    """20,000 rows, one seed each: token frequencies within 4 standard errors of softmax(logits / T)."""
    n, temperature = 20_000, 0.8
    logits_BV = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0]).expand(n, 5)
    sampling = SamplingParams(max_new_tokens=1, temperature=temperature)
    tokens, _ = sample_tokens(logits_BV, sampling, torch.tensor(row_seeds(5, 0, n)))
    freq = torch.bincount(tokens, minlength=5).double() / n
    probs = torch.softmax(logits_BV[0].double() / temperature, -1)
    stderr = torch.sqrt(probs * (1 - probs) / n)
    assert ((freq - probs).abs() <= 4 * stderr).all(), (freq, probs)


def test_gumbel_noise_moments_and_positions_differ():
    noise = gumbel_noise(torch.tensor(row_seeds(9, 0, 4000)), 0, 16)
    assert abs(float(noise.mean()) - 0.5772) < 0.02  # Euler–Mascheroni
    assert abs(float(noise.std()) - math.pi / math.sqrt(6)) < 0.02
    assert not torch.equal(gumbel_noise(torch.tensor([1, 2]), 0, 8), gumbel_noise(torch.tensor([1, 2]), 1, 8))


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(min_value=-(2**62), max_value=2**62),
    n=st.integers(min_value=1, max_value=40),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=4),
)
def test_any_replica_split_samples_the_same_tokens(seed, n, cuts):
    """Rows keep their seed whatever [start, stop) a replica serves: the split never changes a sample."""
    logits_BV = torch.randn(n, 11, generator=torch.Generator().manual_seed(seed % 1000))
    sampling = SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.9)
    whole, _ = sample_tokens(logits_BV, sampling, torch.tensor(row_seeds(seed, 0, n)), position=3)
    bounds = sorted({0, n, *(c for c in cuts if c < n)})
    parts = [
        sample_tokens(logits_BV[a:b], sampling, torch.tensor(row_seeds(seed, a, b - a)), position=3)[0]
        for a, b in zip(bounds, bounds[1:], strict=False)
    ]
    assert torch.equal(torch.cat(parts), whole)


def test_counter_hash_is_deterministic_and_mixes_every_key():
    keys = torch.tensor([[1, 2, 3], [1, 2, 4], [0, 2, 3]])
    out = counter_hash(keys)[:, -1]
    assert torch.equal(out, counter_hash(keys.clone())[:, -1])
    assert len(set(out.tolist())) == 3
    assert row_seeds(3, 0, 10)[4:] == row_seeds(3, 4, 6) and row_seeds(3, 0, 4) != row_seeds(4, 0, 4)
    # any Python int seed (a step seed is seed * 100003 + step): taken mod 2^64, never an overflow
    assert row_seeds(10**30, 0, 2) == row_seeds(10**30 % 2**64, 0, 2) and len(row_seeds(-(10**20), 5, 3)) == 3


def test_rollout_worker_takes_any_int_seed():
    from hpcrl.rl.workers import RolloutWorker
    from hpcrl.rollout.hf_engine import HFRolloutEngine, build_hf_causal_lm
    from hpcrl.train.config import ModelConfig
    from hpcrl.train.workers import Shards

    cfg = ModelConfig(
        vocab_size=16, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=64
    )
    worker = RolloutWorker(
        HFRolloutEngine(build_hf_causal_lm(cfg), 0, 2, device="cpu"), Shards(0, 1), None, 0
    )
    out = worker.generate([[1, 5, 6], [1, 7]], SamplingParams(max_new_tokens=3), seed=10**14 * 100003 + 7)
    assert out.response_ids_BT.shape == (2, 3)
