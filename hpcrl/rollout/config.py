"""Config owned by the rollout side: which engine generates, and how it samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class RolloutConfig:
    """Generation engine and sampling parameters."""

    engine: Literal["auto", "hf", "vllm"] = "auto"
    """auto = vLLM when importable with a usable device, else the HF transformers engine."""
    samples_per_prompt: int = 8
    """Responses sampled per prompt (the group size of GRPO/RLOO)."""
    max_new_tokens: int = 8
    """Response length limit."""
    temperature: float = 1.0
    """Sampling temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = 0
    """Top-k sampling; 0 disables."""
    gpu_memory_utilization: float = 0.5
    """vLLM: fraction of GPU memory for weights + KV cache (colocated with training)."""
    enforce_eager: bool = False
    """vLLM: disable CUDA graphs."""
