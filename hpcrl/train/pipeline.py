"""One micro-batch through all pipeline stages (forward, then optionally backward), over torch.distributed
point-to-point calls.

Why not megatron's schedules: `get_forward_backward_func` allocates its token counter with the string
literal `device="cuda"` (pipeline_parallel/schedules.py), which no device-function mapping can redirect on
a CPU-only torch. This pass is the plain GPipe order for one micro-batch: stage s receives the hidden
states [T, B, H] from s-1, runs its layers, sends to s+1; the last stage computes the head outputs and
the loss; backward runs in reverse, each stage receiving d(loss)/d(output) and sending
d(loss)/d(input). There is no 1F1B overlap: on CPU it would buy nothing. With p = 1 it is just
forward (+ backward). Works for any p; every TP rank of a stage talks to the same TP index of the
neighbour stage. With a `PackedRows` layout the stages run the packed rows [R, W] (every rank of the
block derives the same layout from the same micro-batch) and the last stage unpacks the head outputs
to the micro-batch's [B, T] before the loss (hpcrl.train.packing).

Public: `run_micro_batch`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from hpcrl.train.batch import TrainBatch
from hpcrl.train.logprobs import HeadOutputs
from hpcrl.train.model import TrainGroups, attention_mask_for_megatron, forward_masked
from hpcrl.train.packing import PackedRows

LossFn = Callable[[HeadOutputs, TrainBatch], tuple[torch.Tensor, dict]]


def run_micro_batch(
    model: torch.nn.Module,
    mb: TrainBatch,
    groups: TrainGroups,
    head: Callable[[torch.Tensor, torch.Tensor], HeadOutputs],
    *,
    hidden_size: int,
    dtype: torch.dtype,
    loss_fn: LossFn | None = None,
    loss_scale: float = 1.0,
    packed: PackedRows | None = None,
) -> tuple[HeadOutputs | None, torch.Tensor | None, dict]:
    """Forward `mb` through the stages; with `loss_fn` also backward (grads accumulate in .grad).

    Returns (head outputs, loss, metrics) on the last stage, (None, None, {}) elsewhere; head outputs
    are [B, T] like `mb` whether or not the stages ran it `packed`. Backward runs on `loss * loss_scale`
    (fp16 loss scaling); the returned loss is unscaled.
    """
    if packed is None:
        input_ids, mask = mb.input_ids_BT, attention_mask_for_megatron(mb.attention_mask_BT)
    else:
        input_ids, mask = packed.pack(mb.input_ids_BT), packed.attention_mask()
    B, T = input_ids.shape
    prev = groups.rank_of(groups.tp_rank, groups.pp_rank - 1, groups.dp_rank)
    nxt = groups.rank_of(groups.tp_rank, groups.pp_rank + 1, groups.dp_rank)
    backward = loss_fn is not None
    hidden_in = None
    if not groups.is_first_stage:
        hidden_in = torch.empty(T, B, hidden_size, dtype=dtype, device=mb.input_ids_BT.device)
        dist.recv(hidden_in, prev)
        hidden_in.requires_grad_(backward)
    out = forward_masked(model, input_ids, mask, hidden_in=hidden_in)
    outputs, loss, metrics = None, None, {}
    if not groups.is_last_stage:
        dist.send(out.detach().contiguous(), nxt)
    else:
        outputs = head(out, input_ids)
        if packed is not None:
            outputs = HeadOutputs(**{k: packed.unpack(v) for k, v in outputs.tensors().items()})
        if backward:
            loss, metrics = loss_fn(outputs, mb)
    if backward:
        if groups.is_last_stage:
            (loss * loss_scale if loss_scale != 1.0 else loss).backward()
        else:
            grad_out = torch.empty_like(out)
            dist.recv(grad_out, nxt)
            out.backward(grad_out)
        if not groups.is_first_stage:
            dist.send(hidden_in.grad.contiguous(), prev)
    return outputs, loss, metrics
