"""Token log-probs/entropy (single TP rank; TP=2 equivalence is in test_equivalence) and alignment."""

import torch

from hpcrl.train.logprobs import PolicyHead, ValueHead, vocab_parallel_logprobs_entropy
from hpcrl.train.model import attention_mask_for_megatron


def test_logprobs_and_entropy_equal_log_softmax_on_one_rank():
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(2, 5, 11, generator=gen)
    targets = torch.randint(0, 11, (2, 5), generator=gen)
    logprobs, entropy = vocab_parallel_logprobs_entropy(logits, targets, None, 0)
    ref = torch.log_softmax(logits, -1)
    torch.testing.assert_close(logprobs, ref.gather(-1, targets[..., None])[..., 0])
    torch.testing.assert_close(entropy, -(ref.exp() * ref).sum(-1))


def test_policy_head_aligns_index_t_to_token_t_with_temperature():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 4, 7, generator=gen)
    ids = torch.tensor([[3, 1, 6, 2]])
    out = PolicyHead(None, 0, temperature=2.0)(logits, ids)
    ref = torch.log_softmax(logits / 2.0, -1)
    assert out.logprobs_BT[0, 0] == 0
    for t in range(1, 4):
        torch.testing.assert_close(out.logprobs_BT[0, t], ref[0, t - 1, ids[0, t]])
    values = ValueHead()(torch.arange(4.0).reshape(1, 4, 1), ids).values_BT
    assert values.tolist() == [[0.0, 0.0, 1.0, 2.0]]


def test_megatron_mask_is_true_where_causality_or_padding_forbids():
    keep = torch.tensor([[False, True, True]])
    mask = attention_mask_for_megatron(keep)
    assert mask.shape == (1, 1, 3, 3) and mask.dtype == torch.bool
    assert mask[0, 0].tolist() == [[True, True, True], [True, False, True], [True, False, False]]
