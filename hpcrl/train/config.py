"""Configs owned by the training side: the model architecture and the optimizer/trainer settings."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Literal

from hpcrl.config.ranges import Count, NonNegative, Positive, Range, Seed

TINY_MODEL = MappingProxyType(
    {
        "family": "llama",
        "vocab_size": 32,
        "hidden_size": 64,
        "num_layers": 2,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "ffn_hidden_size": 128,
        "max_position_embeddings": 64,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "qkv_bias": False,
    }
)
"""The architecture fields' defaults without `hf_path`: a tiny Llama that trains in seconds on one CPU.
With `hf_path` an unset field takes config.json's value instead (hpcrl.train.hf_config), so a field's
default cannot sit in the dataclass: None there means "not set"."""
ARCHITECTURE_FIELDS = tuple(TINY_MODEL)
"""ModelConfig fields that describe the architecture (what an HF config.json also says)."""


@dataclass(kw_only=True)
class ModelConfig:
    """A Llama/Qwen2-family decoder, built as a megatron-core GPTModel and as an HF model. Architecture
    fields (family ... qkv_bias) left null come from `hf_path`'s config.json, or without `hf_path` from
    the tiny test model (hpcrl.train.config.TINY_MODEL).

    With `hf_path`, the architecture values a template sets are checked against config.json wherever it
    is readable (`hpcrl plan`, `submit`'s memory preflight, each rank before loading weights): a mismatch
    is an error naming the key and both values. Where config.json is not readable (a path that exists
    only on the cluster), `hpcrl plan` works from the template's values alone.
    """

    family: Literal["llama", "qwen2"] | None = None
    """HF architecture the weights convert to: LlamaForCausalLM (llama) or Qwen2ForCausalLM (qwen2);
    config.json's `model_type`."""
    hf_path: str | None = None
    """An HF model directory (config.json + safetensors) to start from; None builds from the fields of
    this section (random init from `init_seed`)."""
    vocab_size: Annotated[int, Range(ge=1, le=1 << 24)] | None = None
    """Vocabulary size; must divide by every tensor-parallel size used (GPTModel does not pad)."""
    hidden_size: Annotated[int, Range(ge=1, le=1 << 20)] | None = None
    """Model width H."""
    num_layers: Annotated[int, Range(ge=1, le=1 << 12)] | None = None
    """Transformer layers; must divide by the pipeline-parallel size. config.json: num_hidden_layers."""
    num_attention_heads: Annotated[int, Range(ge=1, le=1 << 12)] | None = None
    """Query heads NH; must divide by the tensor-parallel size."""
    num_query_groups: Annotated[int, Range(ge=1, le=1 << 12)] | None = None
    """Key/value heads NG (GQA); NH must divide by NG. config.json: num_key_value_heads."""
    ffn_hidden_size: Annotated[int, Range(ge=1, le=1 << 22)] | None = None
    """SwiGLU inner width. config.json: intermediate_size."""
    max_position_embeddings: Annotated[int, Range(ge=1, le=1 << 24)] | None = None
    """Longest prompt + response the model accepts."""
    rope_theta: Positive | None = None
    """RoPE base."""
    rms_norm_eps: Positive | None = None
    """RMSNorm epsilon."""
    tie_word_embeddings: bool | None = None
    """Share input embedding and output layer."""
    qkv_bias: bool | None = None
    """Bias on q/k/v projections (qwen2 always, llama never; not a config.json key: its family says)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype; CPU runs use float32."""
    init_seed: Seed = 1234
    """Seed of the random initialisation (used when hf_path is None)."""

    def __post_init__(self) -> None:
        """Without `hf_path` nothing else can say the architecture: unset fields take TINY_MODEL's."""
        if self.hf_path is None:
            for name in self.unset_architecture():
                setattr(self, name, TINY_MODEL[name])

    def unset_architecture(self) -> list[str]:
        """Architecture fields still None (only possible with `hf_path`: config.json's to fill)."""
        return [name for name in ARCHITECTURE_FIELDS if getattr(self, name) is None]


@dataclass(kw_only=True)
class OptimizerConfig:
    """AdamW settings of the actor (and critic) updates."""

    lr: NonNegative = 1e-3
    """Learning rate (0 keeps the weights where they start: a run that only evaluates or logs)."""
    critic_lr: NonNegative | None = None
    """Critic learning rate; None uses `lr`."""
    weight_decay: NonNegative = 0.0
    """Decoupled weight decay."""
    betas: tuple[Annotated[float, Range(ge=0, lt=1)], Annotated[float, Range(ge=0, lt=1)]] = (0.9, 0.999)
    """Adam betas."""
    eps: Positive = 1e-8
    """Adam epsilon."""
    grad_clip: NonNegative = 1.0
    """Global grad-norm clip (across TP/PP/DP); 0 disables."""
    micro_batch_size: Count = 8
    """Sequences per forward/backward on one DP rank; gradients accumulate over micro-batches."""
    max_tokens_per_micro_batch: Annotated[int, Range(ge=1, le=1 << 30)] | None = None
    """Token budget of one update micro-batch on one DP rank (verl's use_dynamic_bsz): the rank's share is
    cut into micro-batches of at most this many computed tokens (rows x width, each trimmed to its
    longest row; hpcrl.train.token_budget) instead of micro_batch_size sequences. The gradient is the
    same for any cut. null: micro_batch_size. Must hold the longest sequence (prompt + response)."""
    pack_sequences: bool = False
    """Run each micro-batch as packed rows: whole sequences back to back (first-fit decreasing) in rows
    of a multiple of the longest sequence's width (the cheapest by FLOPs), a block-diagonal causal mask,
    outputs unpacked before the loss (hpcrl.train.packing; verl's use_remove_padding), so padding is
    computed only at the rows' ends. Same log-probs and gradients as padded rows. With
    max_tokens_per_micro_batch, each micro-batch holds budget // width such rows; else micro_batch_size
    sequences. Also the reference, critic and frozen models' forwards."""
    balance_dp_tokens: bool = False
    """Give each DP rank the step's sequences by tokens (longest first to the least-loaded rank, verl's
    balance_batch; hpcrl.train.token_budget.balance_over_ranks) for updates and log-prob recomputation,
    instead of equal contiguous counts; logs dp/token_imbalance (max/mean tokens per rank)."""
    backend: Literal["auto", "torch", "megatron"] = "auto"
    """Who syncs grads and steps: "megatron" = megatron-core DDP + distributed optimizer (fp32 masters
    and Adam moments sharded over DP; on CUDA, or on CPU through hpcrl's compatibility layer, as
    `hpcrl rehearse` runs a GPU recipe), "torch" = hpcrl's DP all-reduce + torch AdamW with unsharded
    fp32 masters (any device), "auto" = megatron with CUDA, else torch."""
    overlap_grad_reduce: bool = True
    """megatron backend: start the bucketed grad reduce-scatter during the last micro-batch's backward."""

    def resolved_backend(self, cuda: bool) -> str:
        """ "torch" or "megatron" on a machine with (`cuda`) or without CUDA: `auto` decided."""
        if self.backend != "auto":
            return self.backend
        return "megatron" if cuda else "torch"
