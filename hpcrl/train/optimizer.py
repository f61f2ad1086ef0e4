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
same masters and a dynamic loss scale (`DynamicLossScale`): fp16 gradients underflow without it.

`TorchUpdate` is the trainer's update step on this path (any device): hpcrl's own DP all-reduce of one
flat buffer, unsharded masters and AdamW state on every DP rank. It implements hpcrl.train.update.UpdateStep,
as the GPU path with megatron's DDP and distributed optimizer does (hpcrl.train.megatron_optimizer);
hpcrl.train.update chooses between them.

Public: `MasterWeights`, `build_adamw`, `TorchUpdate`, `grad_norm`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from hpcrl.train import hf_convert
from hpcrl.train.config import ModelConfig, OptimizerConfig
from hpcrl.train.loss_scale import DynamicLossScale
from hpcrl.train.model import TrainGroups, is_tied, named_global_params

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


def grad_norm(
    model: torch.nn.Module,
    cfg: ModelConfig,
    groups: TrainGroups,
    grads: dict[torch.Tensor, torch.Tensor] | None = None,
) -> float:
    """L2 norm of the whole model's gradient, each parameter counted once across TP and PP.

    TP-split tensors contribute from every TP rank (disjoint shards); replicated ones (norms, value head)
    only from TP rank 0; the last stage's tied copy of the embedding (p > 1) not at all. Summed over
    the TP x PP group. Call after the DP all-reduce (DP replicas then hold equal grads). `grads` maps a
    parameter to the grad to measure (its fp32 master's); None reads `param.grad`.
    """
    total = torch.zeros((), dtype=torch.float64, device=next(model.parameters()).device)
    for name, param in named_global_params(model, cfg, groups):  # skips the tied copy
        grad = grads[param] if grads is not None else param.grad
        if grad is None:
            continue
        if hf_convert.tp_split_dim(name) is None and groups.tp_rank != 0:
            continue
        total += grad.double().pow(2).sum()
    if groups.tensor * groups.pipeline > 1:
        dist.all_reduce(total, group=groups.mp)
    return math.sqrt(float(total))


class TorchUpdate:
    """The update step with torch AdamW: zero grads -> (micro-batches; 16-bit grads moved into fp32
    masters after each) -> tied-embedding grad all-reduce across first/last stage -> DP all-reduce of
    one flat buffer -> unscale (fp16) -> global grad norm -> clip -> AdamW step -> masters rounded
    back into the parameters."""

    def __init__(
        self,
        model: torch.nn.Module,
        model_cfg: ModelConfig,
        groups: TrainGroups,
        optim_cfg: OptimizerConfig,
        lr: float,
    ):
        self.model, self.model_cfg, self.groups, self.cfg = model, model_cfg, groups, optim_cfg
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer, self.masters = build_adamw(trainable, optim_cfg, lr)
        self.scaler = DynamicLossScale() if model_cfg.dtype == "float16" else None

    def zero_grads(self) -> None:
        """Zero every grad the update accumulates into (the params' and, with masters, the fp32 ones)."""
        self.optimizer.zero_grad(set_to_none=False)
        for p in self.model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif self.masters is not None:
                p.grad.zero_()
        if self.masters is not None:
            self.masters.sync_from_params()

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:  # noqa: ARG002
        return contextlib.nullcontext()

    def after_micro_batch(self) -> None:
        if self.masters is not None:
            self.masters.accumulate_grads()

    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    def scaler_state(self) -> dict:
        """The dynamic loss scale's state ({} without fp16)."""
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_scaler_state(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

    def step(self, before_step: Callable[[], None]) -> tuple[float, bool]:
        """Sync, norm, clip and step; returns (pre-clip grad norm, stepped). `before_step` runs right
        before the first in-place write of parameters or optimizer state."""
        grads = self._step_grads()
        self._allreduce_tied_embedding_grads(grads)
        self._allreduce_dp_grads(grads)
        if self.scaler is not None:
            for grad in grads.values():
                grad.div_(self.scaler.scale)
        norm = grad_norm(self.model, self.model_cfg, self.groups, grads)
        finite = math.isfinite(norm)  # the same global value on every rank: all skip or none
        if self.scaler is not None:
            self.scaler.update(finite)
        if not finite:
            return norm, False
        clip = self.cfg.grad_clip
        if clip > 0 and norm > clip:
            for grad in grads.values():
                grad.mul_(clip / (norm + 1e-6))
        before_step()
        self.optimizer.step()
        if self.masters is not None:
            self.masters.copy_to_params()
        return norm, True

    def _step_grads(self) -> dict[torch.Tensor, torch.Tensor]:
        """param -> the grad the step uses: its fp32 master's grad when it has one, else its own."""
        if self.masters is None:
            return {p: p.grad for p in self.model.parameters()}
        return {
            p: (m.grad if (m := self.masters.master_of(p)) is not None else p.grad)
            for p in self.model.parameters()
        }

    def _allreduce_tied_embedding_grads(self, grads: dict[torch.Tensor, torch.Tensor]) -> None:
        """p > 1 with tied embeddings: the first stage's embedding and the last stage's output copy are
        one parameter; sum their grads so both apply the same update (megatron's finalize_model_grads)."""
        if self.groups.embd is None or not is_tied(self.model):
            return
        dist.all_reduce(grads[self.model.shared_embedding_or_output_weight()], group=self.groups.embd)

    def _allreduce_dp_grads(self, grads_by_param: dict[torch.Tensor, torch.Tensor]) -> None:
        if self.groups.data == 1:
            return
        grads = list(grads_by_param.values())
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.groups.dp)
        for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(synced)

    # ------------------------------------------------------------------------------- checkpoint state
    def stepped(self, param: torch.Tensor) -> torch.Tensor:
        """The tensor AdamW steps (and keys its state by) for `param`: its fp32 master, or itself."""
        master = self.masters.master_of(param) if self.masters is not None else None
        return master if master is not None else param

    @torch.no_grad()
    def written_view(self, param: torch.nn.Parameter) -> torch.Tensor:
        """What the step wrote for `param`: its fp32 master rounded to the parameter's dtype (the step's
        last write, `copy_to_params`, stores exactly that), or the parameter AdamW steps itself."""
        stepped = self.stepped(param)
        return stepped.detach() if stepped is param else stepped.detach().to(param.dtype)

    @torch.no_grad()
    def param_state(self, param: torch.nn.Parameter) -> dict[str, torch.Tensor]:
        """Live views: "master" (16-bit params only), the AdamW moments and "step" once it has stepped."""
        stepped = self.stepped(param)
        state = self.optimizer.state.get(stepped, {})
        out = {"master": stepped.detach()} if stepped is not param else {}
        out.update({k: state[k] for k in ("exp_avg", "exp_avg_sq", "step") if k in state})
        return out

    @torch.no_grad()
    def load_param_state(self, param: torch.nn.Parameter, value: torch.Tensor, state: dict | None) -> None:
        stepped = self.stepped(param)
        param.copy_(value)
        if stepped is not param:
            stepped.copy_(value)
        if state is not None:
            held = self.optimizer.state[stepped]
            for key in ("exp_avg", "exp_avg_sq"):
                held[key] = state[key].to(stepped.dtype).clone()
            held["step"] = state["step"].clone()
