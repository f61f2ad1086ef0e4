"""Configs owned by the training side: the model architecture and the optimizer/trainer settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class ModelConfig:
    """A Llama/Qwen2-family decoder, built as a megatron-core GPTModel and as an HF model.

    When `hf_path` is set the architecture fields are read from that HF directory and these are ignored.
    """

    family: Literal["llama", "qwen2"] = "llama"
    """HF architecture the weights convert to: LlamaForCausalLM or Qwen2ForCausalLM."""
    hf_path: str | None = None
    """An HF model directory (config.json + safetensors) to start from; None builds from the fields below."""
    vocab_size: int = 32
    """Vocabulary size; must divide by every tensor-parallel size used (GPTModel does not pad)."""
    hidden_size: int = 64
    """Model width H."""
    num_layers: int = 2
    """Transformer layers; must divide by the pipeline-parallel size."""
    num_attention_heads: int = 4
    """Query heads NH; must divide by the tensor-parallel size."""
    num_query_groups: int = 2
    """Key/value heads NG (GQA); NH must divide by NG."""
    ffn_hidden_size: int = 128
    """SwiGLU inner width."""
    max_position_embeddings: int = 64
    """Longest prompt + response the model accepts."""
    rope_theta: float = 10000.0
    """RoPE base."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    tie_word_embeddings: bool = False
    """Share input embedding and output layer."""
    qkv_bias: bool = False
    """Bias on q/k/v projections (Qwen2: True)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype; CPU runs use float32."""
    init_seed: int = 1234
    """Seed of the random initialisation (used when hf_path is None)."""


@dataclass(kw_only=True)
class OptimizerConfig:
    """AdamW settings of the actor (and critic) updates."""

    lr: float = 1e-3
    """Learning rate."""
    critic_lr: float | None = None
    """Critic learning rate; None uses `lr`."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    eps: float = 1e-8
    """Adam epsilon."""
    grad_clip: float = 1.0
    """Global grad-norm clip (across TP/PP/DP); 0 disables."""
    micro_batch_size: int = 8
    """Sequences per forward/backward on one DP rank; gradients accumulate over micro-batches."""
    backend: Literal["auto", "torch", "megatron"] = "auto"
    """Who syncs grads and steps: "megatron" = megatron-core DDP + distributed optimizer (fp32 masters
    and Adam moments sharded over DP; CUDA only), "torch" = hpcrl's DP all-reduce + torch AdamW with
    unsharded fp32 masters (any device), "auto" = megatron with CUDA, else torch."""
    overlap_grad_reduce: bool = True
    """megatron backend: start the bucketed grad reduce-scatter during the last micro-batch's backward."""
