"""The trainer's AdamW, with fp32 master weights when the model's parameters are 16-bit.

Why masters: with bf16 parameters, AdamW straight on the parameters keeps its moments in bf16 and adds
each update to a bf16 weight; an update smaller than half the bf16 spacing of the weight (2^-9 of |w|)
rounds away, step after step, so small learning rates silently stop training. Mixed-precision training
(Micikevicius et al. 2018, "Mixed Precision Training", §3.1; megatron-core's Float16OptimizerWithFloat16Params,
verl's FSDP/Megatron workers) keeps an fp32 master copy of every trainable parameter:

    grad_fp32  += grad_bf16              after every micro-batch (fp32 accumulation, megatron's main_grad)
    DP all-reduce, grad-norm, clip       on grad_fp32
    AdamW step                           on the fp32 masters, m and v in fp32
    param_bf16  = round(master_fp32)     after every step

fp32 models get no copies: AdamW runs on the parameters themselves, as before. fp16 parameters get the
same masters but no loss scaling (fp16 gradients can underflow; bf16 is what the GPU recipes use).

Public: `MasterWeights`, `build_adamw`.
"""

from __future__ import annotations

import torch

from hpcrl.train.config import OptimizerConfig

_LOW_PRECISION = (torch.bfloat16, torch.float16)


class MasterWeights:
    """fp32 master copies (with fp32 grads) of 16-bit parameters; the optimizer steps the masters."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = params
        self.masters = [torch.nn.Parameter(p.detach().float().clone()) for p in params]
        for master in self.masters:
            master.grad = torch.zeros_like(master)
        self._by_param = dict(zip(params, self.masters, strict=True))  # tensors hash by identity

    def master_of(self, param: torch.Tensor) -> torch.nn.Parameter | None:
        """The master of `param`, or None for a parameter without one (fp32, or not trainable)."""
        return self._by_param.get(param)

    @torch.no_grad()
    def sync_from_params(self) -> None:
        """Masters follow any write into the parameters made outside the optimizer (a weight load):
        an element whose master no longer rounds to the parameter takes the parameter's value. After our
        own steps every master rounds to its parameter, so this changes nothing then."""
        for param, master in zip(self.params, self.masters, strict=True):
            if not torch.equal(master.to(param.dtype), param):
                stale = master.to(param.dtype) != param
                master[stale] = param[stale].float()

    @torch.no_grad()
    def accumulate_grads(self) -> None:
        """Move this micro-batch's 16-bit grads into the fp32 master grads (sum over micro-batches in fp32)."""
        for param, master in zip(self.params, self.masters, strict=True):
            master.grad.add_(param.grad)
            param.grad.zero_()

    @torch.no_grad()
    def copy_to_params(self) -> None:
        """Round the stepped masters into the model's 16-bit parameters (round to nearest even)."""
        for param, master in zip(self.params, self.masters, strict=True):
            param.copy_(master)


def build_adamw(
    params: list[torch.nn.Parameter], cfg: OptimizerConfig, lr: float
) -> tuple[torch.optim.AdamW, MasterWeights | None]:
    """AdamW over `params`, with each bf16/fp16 one replaced by its fp32 master (the masters are returned
    too; None when every parameter is fp32 and AdamW steps the parameters themselves)."""
    low_precision = [p for p in params if p.dtype in _LOW_PRECISION]
    masters = MasterWeights(low_precision) if low_precision else None
    if masters is not None:  # fp32 parameters of a bf16 model (megatron's norms on CPU) step themselves
        params = [m if (m := masters.master_of(p)) is not None else p for p in params]
    optimizer = torch.optim.AdamW(
        params,
        lr=lr,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
    )
    return optimizer, masters
