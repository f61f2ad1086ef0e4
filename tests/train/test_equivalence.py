"""Invariance tests (fp32): loss, grads, forward outputs and the clipped optimizer step of the policy and
the critic agree across training layouts t=1, t=2, p=2 (tied embeddings), d=2, and across micro-batching
1x4 vs 4x1. Tolerance: 1e-5 relative to the tensor's largest entry (TP changes the all-reduce summation
order, so t=2 is not bitwise); weights after an AdamW step: 1e-4 (Adam divides by sqrt(v), which amplifies
~1e-7 grad differences of near-zero entries)."""

import pytest
import torch

from hpcrl.distributed.spawn import run_ranks
from tests.train import _rank_fns as fns

pytestmark = [pytest.mark.dist, pytest.mark.slow]
GRAD_RTOL, STEP_RTOL = 1e-5, 1e-4


def max_rel_diff(got: dict, ref: dict) -> float:
    assert got.keys() == ref.keys(), set(got) ^ set(ref)
    return max(float((got[k] - ref[k]).abs().max() / ref[k].abs().max().clamp(min=1e-12)) for k in ref)


def assert_same_training(got: dict, ref: dict, *, check_forward: bool = True) -> None:
    for kind in ("policy", "value"):
        g, r = got[kind], ref[kind]
        assert g["metrics"]["loss"] == pytest.approx(r["metrics"]["loss"], rel=GRAD_RTOL), kind
        assert g["metrics"]["grad_norm"] == pytest.approx(r["metrics"]["grad_norm"], rel=GRAD_RTOL), kind
        assert max_rel_diff(g["grads"], r["grads"]) <= GRAD_RTOL, kind
        assert g["clipped"]["grad_norm"] == pytest.approx(r["clipped"]["grad_norm"], rel=STEP_RTOL), kind
        assert max_rel_diff(g["weights"], r["weights"]) <= STEP_RTOL, kind
        if check_forward:
            assert max_rel_diff(g["forward"], r["forward"]) <= GRAD_RTOL, kind


@pytest.fixture(scope="module")
def d2_and_references():
    rank0, rank1 = run_ranks(fns.data_parallel_and_references, 2)
    return rank0, rank1


def test_data_parallel_2_equals_one_rank_and_replicas_stay_in_sync(d2_and_references):
    rank0, rank1 = d2_and_references
    assert_same_training(rank0["d2"], rank0["ref"][False], check_forward=False)
    for kind in ("policy", "value"):
        assert max_rel_diff(rank1["d2"][kind]["weights"], rank0["d2"][kind]["weights"]) == 0.0
        assert rank1["d2"][kind]["metrics"] == rank0["d2"][kind]["metrics"]
    # the policy loss actually moved the weights (the test could otherwise pass on a no-op step)
    start = fns.random_full_state_dict(fns.tiny_config("qwen2"), seed=11)
    assert max_rel_diff(rank0["d2"]["policy"]["weights"], start) > 1e-3


def test_micro_batches_1x4_and_4x1_accumulate_to_the_same_loss_and_grads(d2_and_references):
    acc = d2_and_references[0]["accumulation"]
    assert acc[1]["loss"] == pytest.approx(acc[4]["loss"], rel=GRAD_RTOL)
    assert max_rel_diff(acc[1]["grads"], acc[4]["grads"]) <= GRAD_RTOL


def test_a_nan_loss_skips_the_optimizer_step_and_says_so(d2_and_references):
    nan = d2_and_references[0]["accumulation"]["nan"]
    assert nan["metrics"]["update_skipped_nonfinite"] == 1.0
    assert nan["unchanged"]


def test_pipeline_2_with_tied_embeddings_equals_one_rank(d2_and_references):
    ref = d2_and_references[0]["ref"][True]
    first, last = run_ranks(fns.train_snapshot, 2, 1, 2, 1, True)
    assert first["tied_copies_equal_at_init"] and last["tied_copies_equal_at_init"]
    assert_same_training(last, ref)
    assert_same_training(first, ref)  # stage 0 gets the same outputs and metrics back


def test_tensor_parallel_2_equals_one_rank_and_loads_an_hf_directory(d2_and_references, tmp_path):
    from transformers import AutoModelForCausalLM

    from hpcrl.train import hf_convert

    cfg = fns.tiny_config("llama", num_query_groups=2)
    torch.manual_seed(0)
    hf_model = AutoModelForCausalLM.from_config(
        hf_convert.model_config_to_hf(cfg), attn_implementation="eager"
    )
    with torch.no_grad():
        for param in hf_model.parameters():
            param.normal_(0, 0.3)
    hf_model.save_pretrained(tmp_path)
    batch = fns.tiny_batch(cfg)
    with torch.no_grad():
        hf_logits = hf_model(
            input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT.long()
        ).logits

    rank0, rank1 = run_ranks(fns.tensor_parallel_and_hf_dir, 2, str(tmp_path))
    assert_same_training(rank0["t2"], d2_and_references[0]["ref"][False])
    assert rank0["hf_dir_config"] == hf_convert.model_config_from_hf(hf_model.config, hf_path=str(tmp_path))
    keep = batch.attention_mask_BT
    assert float((rank0["hf_dir_logits"] - hf_logits)[keep].abs().max()) <= 1e-5
