"""The megatron rollout engine at generation layouts t_g, p_g > 1, fed by the 3D-HybridEngine (real gloo).

One spawn of 4 ranks runs every layout: a random actor (every parameter random) at the training layout,
resharded into the engine's generation store. Checked per layout and rank:
- zero copy: every engine parameter lies inside the store's buffer (data_ptr), before and after a
  sleep/wake cycle, and is empty while asleep;
- the reshard received exactly the HybridFlow bound (the counting transport vs the plan's lower bound);
- greedy tokens equal the whole-model HF engine's on the same weights, token for token, and equal across
  every layout (t_g = 1, t_g = 2, p_g = 2); log-probs within LOGPROB_TOL;
- sampled tokens are the same on every rank of a generation replica, and their log-probs equal the
  training layout's teacher-forced log-probs within LOGPROB_TOL (the rollout-vs-trainer contract).
"""

from __future__ import annotations

import pytest
import torch

from hpcrl.distributed.spawn import run_ranks
from tests.rollout._megatron_rank_fns import generation_parity_rank

pytestmark = pytest.mark.dist

LOGPROB_TOL = 1e-5
"""fp32: TP sums in another order differ by ~1e-6 (docs/FACTS.md, megatron <-> HF parity); 10x margin."""
LAYOUTS = [
    (4, 1, 1, 2, 1),  # t=4 -> t_g=2: generation TP groups [0,2],[1,3] (strided), micro-DP [0,1],[2,3]
    (2, 2, 1, 2, 1),  # t=2,p=2 -> t_g=2,p_g=1: the two stages merge
    (1, 4, 1, 1, 2),  # p=4 -> p_g=2: generation pipeline of 2 stages
    (2, 2, 1, 1, 2),  # t=2,p=2 -> t_g=1,p_g=2
    (4, 1, 1, 1, 1),  # t=4 -> t_g=1: the whole model on every rank
    (4, 1, 1, 2, 1, 4096),  # t=4 -> t_g=2 in 4 KiB buckets: gather_into's per-member buffer path
]


@pytest.fixture(scope="module")
def results():
    return run_ranks(generation_parity_rank, 4, LAYOUTS, timeout_s=300)


def test_engine_parameters_are_views_of_the_generation_store(results):
    for rank_results in results:
        for r in rank_results:
            assert r["zero_copy"], f"{r['layout']}: an engine parameter is not inside the store"


def test_reshard_into_the_engine_receives_exactly_the_hybridflow_bound(results):
    for rank, rank_results in enumerate(results):
        for r in rank_results:
            assert r["bytes_received"] == r["bound_bytes"], f"{r['layout']} rank {rank}"
    t4_tg2 = results[0][0]  # d_g = 2: half the generation shard arrives, the other half is the own shard
    assert t4_tg2["bytes_received"] > 0 and t4_tg2["bytes_received"] < t4_tg2["store_bytes"]


def test_greedy_tokens_equal_the_whole_model_on_every_layout(results):
    hf_ids, hf_logprobs = results[0][0]["hf_greedy"]
    assert (hf_ids != 0).any(), "the reference generated nothing"
    for rank, rank_results in enumerate(results):
        for r in rank_results:
            where = f"{r['layout']} rank {rank}"
            assert torch.equal(r["greedy_ids"], hf_ids), where
            torch.testing.assert_close(r["greedy_logprobs"], hf_logprobs, atol=LOGPROB_TOL, rtol=0)
            assert r["greedy_again"], f"{where}: greedy output changed after sleep/wake"


def test_seeded_samples_are_the_same_on_every_layout_and_match_the_trainer(results):
    """Per-row seeds (Gumbel-max over a counter-based hash): the same tokens on every rank of every layout,
    and in waves (rollout.max_num_seqs) as in one call."""
    reference = results[0][0]["sampled_ids"]
    assert len({tuple(row) for row in reference.tolist()}) > 1
    for rank, rank_results in enumerate(results):
        for r in rank_results:
            assert torch.equal(r["sampled_ids"], reference), f"{r['layout']} rank {rank}"
            assert torch.equal(r["wave_ids"], reference), (
                f"{r['layout']} rank {rank}: waves of 2 + 3 rows differ"
            )
            assert r["sampled_mismatch"] <= LOGPROB_TOL, f"{r['layout']} rank {rank}: {r['sampled_mismatch']}"


def test_rows_that_finish_leave_the_batch_without_changing_any_sample(results):
    """Issue 25 item 5: a row that sampled EOS leaves the decode batch; every other row's samples and
    log-probs are the static batch's (per-row seeds), on every layout."""
    lengths = results[0][0]["sampled_lengths"]
    assert min(lengths) < max(lengths), f"no row finished early: the test would not drop a row {lengths}"
    for rank, rank_results in enumerate(results):
        for r in rank_results:
            where = f"{r['layout']} rank {rank}"
            assert torch.equal(r["sampled_ids"], r["static_ids"]), where
            torch.testing.assert_close(r["sampled_logprobs"], r["static_logprobs"], atol=LOGPROB_TOL, rtol=0)


def test_continuous_batching_samples_what_the_whole_batch_does(results):
    """2 rows decode at once, the other 3 prompts join as rows finish, the cache's columns shift when the
    shared column reaches its end: every row's samples and log-probs are the whole batch's."""
    assert any(r["shifts"] for rank_results in results for r in rank_results), "no column shift happened"
    for rank, rank_results in enumerate(results):
        for r in rank_results:
            where = f"{r['layout']} rank {rank}"
            assert torch.equal(r["continuous_ids"], r["sampled_ids"]), where
            assert torch.equal(r["short_first_ids"], r["sampled_ids"]), f"{where}: short prompts first"
            torch.testing.assert_close(
                r["continuous_logprobs"], r["sampled_logprobs"], atol=LOGPROB_TOL, rtol=0
            )


def test_unseeded_samples_agree_within_a_replica_and_match_the_trainer(results):
    for i, layout in enumerate(LAYOUTS):
        by_replica: dict[int, torch.Tensor] = {}
        for rank, rank_results in enumerate(results):
            r = rank_results[i]
            assert r["unseeded_mismatch"] <= LOGPROB_TOL, f"{r['layout']} rank {rank}"
            first = by_replica.setdefault(r["replica"], r["unseeded_ids"])
            assert torch.equal(first, r["unseeded_ids"]), f"{r['layout']}: replica {r['replica']} disagrees"
        assert len(by_replica) == 4 // (layout[3] * layout[4])


@pytest.mark.gpu
def test_on_cuda_the_engine_matches_the_hf_engine_and_sleep_frees_its_store():
    """One GPU, NCCL, t = t_g = 1: the same parity checks on CUDA; sleep() returns the store's memory."""
    [[r]] = run_ranks(generation_parity_rank, 1, [(1, 1, 1, 1, 1)], backend="nccl", timeout_s=300)
    hf_ids, hf_logprobs = r["hf_greedy"]
    assert r["zero_copy"] and r["greedy_again"]
    assert torch.equal(r["greedy_ids"], hf_ids)
    torch.testing.assert_close(r["greedy_logprobs"], hf_logprobs, atol=1e-4, rtol=0)
    assert r["sampled_mismatch"] <= 1e-4
    assert r["freed_by_sleep"] >= r["store_bytes"]
