"""The update step: the one interface the trainer drives, and the choice of its backend.

    zero_grads -> for each micro-batch: with accumulating(last): backward(loss * loss_scale())
                                        after_micro_batch()
               -> step(before_step) -> (pre-clip grad norm, stepped)

Two implementations: `TorchUpdate` (hpcrl.train.optimizer; any device, hpcrl's flat DP all-reduce and
unsharded AdamW) and `MegatronUpdate` (hpcrl.train.megatron_optimizer; megatron-core DDP and the
distributed optimizer: CUDA, or CPU through hpcrl.train.megatron_compat.enable_optimizer, which is how
`hpcrl rehearse` and the CPU tests run a GPU recipe's update path).

The update step owns the parameters' storage: megatron's DDP makes every parameter a view of its
contiguous param buffer, which the distributed optimizer steps and all-gathers into; nothing else may
repoint `.data` (the reshard engine reads the parameters in place). `written_view(param)` is the
optimizer's own view of what it last wrote, for the weight-sync check (hpcrl.reshard.engine.verify). Both SUM grads over micro-batches and DP ranks (the trainer normalises the loss
with global counts), count each parameter once in the grad norm and skip a non-finite step on every
rank. Checkpoints see the optimizer through `param_state` / `load_param_state`: per parameter, whole
over DP, whatever the backend shards (hpcrl.ckpt.megatron writes it as HDF5 shards).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

import torch

from hpcrl.train.config import ModelConfig, OptimizerConfig
from hpcrl.train.megatron_optimizer import MegatronUpdate
from hpcrl.train.model import TrainGroups
from hpcrl.train.optimizer import TorchUpdate


class UpdateStep(Protocol):
    """What the trainer and the checkpoint need from an optimizer backend."""

    def zero_grads(self) -> None:
        """Zero every grad the step accumulates into; masters follow writes made into the params."""

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:
        """Context around one micro-batch's backward (`last`: the step's final micro-batch)."""

    def after_micro_batch(self) -> None:
        """Move or keep this micro-batch's grads where the step reads them."""

    def loss_scale(self) -> float:
        """The factor the loss is multiplied by before backward (1.0 without fp16)."""

    def scaler_state(self) -> dict:
        """The fp16 loss scale's JSON-able state ({} without fp16)."""

    def load_scaler_state(self, state: dict) -> None:
        """Restore `scaler_state()`'s output."""

    def step(self, before_step: Callable[[], None]) -> tuple[float, bool]:
        """Sync, norm, clip, step; `before_step` runs right before the first in-place write.
        Returns (pre-clip grad norm, stepped)."""

    def param_state(self, param: torch.nn.Parameter) -> dict[str, torch.Tensor]:
        """`param`'s optimizer state, whole over DP: "master" (16-bit params), Adam moments, "step"."""

    def load_param_state(self, param: torch.nn.Parameter, value: torch.Tensor, state: dict | None) -> None:
        """Set `param` to `value` and its optimizer state to `state` (None: a fresh optimizer)."""

    def written_view(self, param: torch.nn.Parameter) -> torch.Tensor:
        """`param`'s weights as the optimizer wrote them, read through the optimizer's own reference
        (not through `param.data`): what the model must hold after every step."""


def resolve_backend(cfg: OptimizerConfig, cuda: bool | None = None) -> str:
    """ "torch" or "megatron" (auto: megatron where CUDA is, as on a GPU cluster; torch on CPU).
    `cuda`: decide as on a machine with (True) or without (False) CUDA; None: this process's."""
    return cfg.resolved_backend(torch.cuda.is_available() if cuda is None else cuda)


def build_update(
    model: torch.nn.Module, model_cfg: ModelConfig, groups: TrainGroups, optim_cfg: OptimizerConfig, lr: float
) -> UpdateStep:
    """The update step of `optim_cfg.backend` (see `resolve_backend`)."""
    backend = MegatronUpdate if resolve_backend(optim_cfg) == "megatron" else TorchUpdate
    return backend(model, model_cfg, groups, optim_cfg, lr)
