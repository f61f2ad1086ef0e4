"""Token log-probs, entropy and values from the last pipeline stage's output, correct under TP.

Shapes: B sequences, T tokens, V vocabulary, Vt = V/t the vocab shard of one TP rank.

Alignment (the convention every hpcrl RL tensor uses): index t of a [B, T] output belongs to token t
of `input_ids_BT`; it is computed from the model output at position t-1 (the state before token t is
generated). Index 0 has no predecessor and is 0. So `logprobs_BT[b, t] = log p(x_t | x_<t)`, and a
response mask over tokens selects exactly the generated tokens' log-probs, entropies and values.

Under TP each rank holds logits for its vocab rows [rank*Vt, (rank+1)*Vt). Log-softmax needs three
sums over the full vocabulary: they are taken with megatron's `reduce_from_tensor_model_parallel_region`
(forward: all-reduce over the TP group; backward: identity), the same autograd rule as megatron's
`_VocabParallelCrossEntropy`: every TP rank computes the identical (replicated) loss downstream, so each
rank's local logits get exactly their own gradient, not t copies. The max is a detached all-reduce(MAX)
(a constant shift, it does not change log-softmax).

Public: `vocab_parallel_logprobs_entropy`, `shift_to_tokens`, `PolicyHead`, `ValueHead`, `HeadOutputs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


def _reduce_sum(x: torch.Tensor, tp_group: dist.ProcessGroup | None) -> torch.Tensor:
    if tp_group is None or dist.get_world_size(tp_group) == 1:
        return x
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(x, group=tp_group)


def vocab_parallel_logprobs_entropy(
    logits_BTVt: torch.Tensor, targets_BT: torch.Tensor, tp_group: dist.ProcessGroup | None, vocab_start: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(targets) and the entropy of the full softmax, from this rank's vocab shard.

    logprob = z_y - m - log S,  S = sum_v exp(z_v - m),  m = max_v z_v;
    entropy = log S - (1/S) sum_v exp(z_v - m) (z_v - m).
    Sums over v span all TP ranks. Returns (logprobs_BT, entropy_BT), float32.
    """
    logprobs_BT, entropy_BT, _ = _logprobs_entropy_margin(logits_BTVt, targets_BT, tp_group, vocab_start)
    return logprobs_BT, entropy_BT


def _logprobs_entropy_margin(
    logits_BTVt: torch.Tensor, targets_BT: torch.Tensor, tp_group: dist.ProcessGroup | None, vocab_start: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprobs_BT, entropy_BT, z_y - m): the last is 0 exactly where the target is an argmax of the
    full vocabulary (m is the global max), negative elsewhere."""
    logits = logits_BTVt.float()
    vt = logits.shape[-1]
    m_BT = logits.detach().max(dim=-1).values
    if tp_group is not None and dist.get_world_size(tp_group) > 1:
        dist.all_reduce(m_BT, op=dist.ReduceOp.MAX, group=tp_group)
    shifted = logits - m_BT.unsqueeze(-1)
    exp = shifted.exp()
    sum_exp_BT = _reduce_sum(exp.sum(-1), tp_group)
    local_target = targets_BT - vocab_start
    in_shard = (local_target >= 0) & (local_target < vt)
    picked = shifted.gather(-1, local_target.clamp(0, vt - 1).unsqueeze(-1)).squeeze(-1)
    target_shifted_BT = _reduce_sum(torch.where(in_shard, picked, torch.zeros_like(picked)), tp_group)
    log_sum_BT = sum_exp_BT.log()
    logprobs_BT = target_shifted_BT - log_sum_BT
    weighted_BT = _reduce_sum((exp * shifted).sum(-1), tp_group)
    entropy_BT = log_sum_BT - weighted_BT / sum_exp_BT
    return logprobs_BT, entropy_BT, target_shifted_BT


def shift_to_tokens(per_position_BT: torch.Tensor) -> torch.Tensor:
    """[B, T-1] values computed at positions 0..T-2 -> [B, T] aligned to tokens 1..T-1 (index 0 = 0)."""
    return torch.nn.functional.pad(per_position_BT, (1, 0))


@dataclass
class HeadOutputs:
    """Per-token outputs of one (micro-)batch, aligned to tokens (see module doc); None when not computed."""

    logprobs_BT: torch.Tensor | None = None
    entropy_BT: torch.Tensor | None = None
    values_BT: torch.Tensor | None = None
    greedy_BT: torch.Tensor | None = None
    """1.0 where token t is the model's argmax given x_<t (greedy decoding would produce it), else 0."""

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in vars(self).items() if v is not None}


class PolicyHead:
    """Turns vocab-parallel logits [B, T, Vt] into token log-probs and entropy (actor, reference).

    `temperature` divides the logits first, to score tokens the way the rollout sampled them. With
    `greedy`, also whether each token is the argmax (`greedy_BT`: SFT's token accuracy and exact match).
    """

    def __init__(
        self,
        tp_group: dist.ProcessGroup | None,
        tp_rank: int,
        temperature: float = 1.0,
        *,
        greedy: bool = False,
    ):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.tp_group, self.tp_rank, self.temperature = tp_group, tp_rank, temperature
        self.keys = ("logprobs_BT", "entropy_BT", "greedy_BT") if greedy else ("logprobs_BT", "entropy_BT")

    def __call__(self, model_out_BTX: torch.Tensor, input_ids_BT: torch.Tensor) -> HeadOutputs:
        logits = model_out_BTX[:, :-1]
        if self.temperature != 1.0:
            logits = logits / self.temperature
        vocab_start = self.tp_rank * model_out_BTX.shape[-1]
        logprobs, entropy, margin = _logprobs_entropy_margin(
            logits, input_ids_BT[:, 1:], self.tp_group, vocab_start
        )
        greedy = shift_to_tokens((margin.detach() >= 0).float()) if "greedy_BT" in self.keys else None
        return HeadOutputs(
            logprobs_BT=shift_to_tokens(logprobs), entropy_BT=shift_to_tokens(entropy), greedy_BT=greedy
        )


class ScoreHead:
    """Turns a ScalarHead output [B, T, 1] into per-position scores, unshifted: values_BT[b, t] = r(x_<=t),
    the score of the prefix ending at token t (a reward model reads it at each row's last real token,
    where transformers' `*ForSequenceClassification` reads its score: hpcrl.posttrain.rm)."""

    keys = ("values_BT",)

    def __call__(self, model_out_BTX: torch.Tensor, input_ids_BT: torch.Tensor) -> HeadOutputs:  # noqa: ARG002
        return HeadOutputs(values_BT=model_out_BTX[:, :, 0].float())


class ValueHead:
    """Turns the critic's ScalarHead output [B, T, 1] into values aligned to tokens:
    values_BT[b, t] = V(x_<t), the value of the state in which token t is generated."""

    keys = ("values_BT",)

    def __call__(self, model_out_BTX: torch.Tensor, input_ids_BT: torch.Tensor) -> HeadOutputs:  # noqa: ARG002
        return HeadOutputs(values_BT=shift_to_tokens(model_out_BTX[:, :-1, 0].float()))


def last_token_scores_B(values_BS: torch.Tensor, attention_BS: torch.Tensor) -> torch.Tensor:
    """Each row's score at its last attended token, [B] (rows are right padded)."""
    last_B = attention_BS.long().sum(dim=1) - 1
    return values_BS.gather(1, last_B[:, None]).squeeze(1)
