"""The model dtypes (ModelConfig.dtype's names) and the one rule about them: a model is one dtype."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""ModelConfig.dtype -> torch dtype."""


def cast_to_model_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Every floating parameter in the model's dtype, as megatron's `Float16Module` casts a bf16/fp16
    model (megatron-LM `get_model`). Why: megatron's local spec builds `torch.nn.RMSNorm` without a dtype
    (fp32 norms beside bf16 matrices) where TE's norms take `params_dtype`, so the same recipe would be
    one dtype on one machine and mixed on another; and megatron-core 0.16.1's distributed optimizer pairs
    optimizer state with the wrong parameters when a param group mixes fp32 and 16-bit parameters
    (`_build_optimizer_group_ranges` numbers a group's params in buffer order, `_build_model_and_main_
    param_groups` then puts the fp32 ones first: distrib_optimizer.py:297 vs :441), which corrupts every
    checkpoint of its state. The fp32 copies live in the optimizer (masters), as megatron intends."""
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
