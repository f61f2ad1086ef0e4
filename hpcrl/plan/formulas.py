"""Memory formulas of one rank, as pure functions of model dims and layout (bytes unless noted).

Notation: s tokens per sequence (prompt + response), b sequences per micro-batch, h hidden, a query heads,
g kv heads (GQA groups), d head dim, f SwiGLU inner width, V vocabulary, L layers, t/p training TP/PP,
t_g/p_g generation TP/PP, e bytes per element of the model dtype.

Sources
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.1-4.2:
  per layer, 16-bit activations, no recompute, no sequence parallelism:
  s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes (= s·b·h·(34 + 5·a·s/h) at t = 1). `korthikanti_layer_bytes`.
- hpcrl's block is a Llama block (RMSNorm, RoPE, GQA, SwiGLU, no dropout), so `llama_layer_bytes`
  applies the same accounting (tensors autograd keeps for backward) to that block; see its docstring.
- HybridFlow (Sheng et al., EuroSys'25) Table 2: the micro-DP all-gather receives
  M/(t_g·p_g) − M/(t·p) per rank, M = bytes of the model-parallel-split parameters.
- Mixed-precision AdamW (Rajbhandari et al. 2020, ZeRO §3.1: 2 + 2 + 12 bytes/param for fp16 params,
  grads, fp32 master + m + v): 2 fp32 states, + an fp32 master copy when the params are 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FP32 = 4


@dataclass(frozen=True)
class Dims:
    """Architecture sizes the formulas need (from ModelConfig or an HF config.json)."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    tied: bool = False
    qkv_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class StageParams:
    """Parameter counts of one rank (one TP shard of one pipeline stage)."""

    split: int
    """Elements split across TP (embedding, output layer, linear weights): M_split/(t) of this stage."""
    replicated: int
    """Elements every TP rank holds in full (norms, a critic's scalar head)."""

    @property
    def total(self) -> int:
        return self.split + self.replicated


def layer_params(dims: Dims, tensor: int) -> StageParams:
    """One decoder layer on one TP rank: qkv [(a + 2g)·d, h] (+ bias), proj [h, a·d], fc1 [2f, h],
    fc2 [h, f] are split by t; the two RMSNorm weights (2h) are replicated (Megatron TP layout)."""
    d = dims.head_dim
    qkv_rows = (dims.heads + 2 * dims.kv_heads) * d
    split = qkv_rows * dims.hidden + dims.hidden * dims.heads * d + 3 * dims.ffn * dims.hidden
    if dims.qkv_bias:
        split += qkv_rows
    return StageParams(split=split // tensor, replicated=2 * dims.hidden)


def rank_params(dims: Dims, tensor: int, pipeline: int, *, value_head: bool = False) -> StageParams:
    """The largest stage's parameters on one rank. First stage: embedding V·h/t; last stage: final norm h
    and output layer V·h/t (with p > 1 a tied model keeps a copy there; with p = 1 tied = one tensor),
    or a critic's replicated scalar head h. Layers: L/p per stage."""
    layer = layer_params(dims, tensor)
    per_stage = dims.layers // pipeline
    embed = dims.vocab * dims.hidden // tensor
    body_split, body_repl = layer.split * per_stage, layer.replicated * per_stage
    output_split = 0 if value_head or (dims.tied and pipeline == 1) else embed
    head_repl = dims.hidden + (dims.hidden if value_head else 0)
    if pipeline == 1:
        return StageParams(split=body_split + embed + output_split, replicated=body_repl + head_repl)
    first = StageParams(split=body_split + embed, replicated=body_repl)
    last = StageParams(split=body_split + output_split, replicated=body_repl + head_repl)
    return max(first, last, key=lambda sp: sp.total)


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, tensor: int = 1) -> float:
    """Korthikanti et al. 2022 §4.2 (eq. 2, TP without sequence parallelism), GPT block with 16-bit
    activations, 1-byte dropout masks, 4h GeLU MLP: s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes per layer.
    At t = 1 this is §4.1's s·b·h·(34 + 5·a·s/h). Kept as the published reference point."""
    return s * b * h * (10 + 24 / tensor + 5 * a * s / (h * tensor))


def llama_layer_bytes(dims: Dims, s: int, b: int, e: int, tensor: int = 1) -> float:
    """Activations one Llama layer keeps for backward (no recompute, no dropout), Korthikanti §4's
    accounting applied to hpcrl's block (megatron local spec, torch RMSNorm, unfused softmax):

    replicated over TP (inputs of the norms and of the column-parallel linears):
      2 RMSNorms × (input + normalised input)     4·sbh
      linear_qkv input, linear_fc1 input           2·sbh
    split over TP (per rank /t):
      q and k after RoPE (k expanded to a heads)   2·sb·a·d
      v (expanded to a heads)                       sb·a·d
      softmax output (kept by softmax and by @V)    a·s²·b
      linear_proj input (attention context)         sb·a·d
      linear_fc1 output [gate; up] (kept by silu)   2·sbf
      silu(gate) and up (the product's inputs; megatron's glu keeps its own copy of up), and the
      product fed to linear_fc2                     3·sbf
    Total elements · e bytes. The list was checked tensor by tensor with torch.autograd.graph's
    saved_tensors_hooks on megatron-core 0.16.1 (hpcrl.plan.measure). With GPT's block (LayerNorm, 4h GeLU
    MLP, 2-byte elements, 1-byte dropout masks) the same bookkeeping gives the paper's 34·sbh + 5·a·s²·b.
    """
    ad = dims.heads * dims.head_dim
    replicated = 6 * s * b * dims.hidden
    split = 4 * s * b * ad + dims.heads * s * s * b + 5 * s * b * dims.ffn
    return e * (replicated + split / tensor)


def logits_bytes(dims: Dims, s: int, b: int, e: int, tensor: int = 1) -> float:
    """The output layer's logits [s, b, V/t] in the model dtype, plus hpcrl's vocab-parallel log-softmax
    (hpcrl.train.logprobs): fp32 shifted logits, their exp, and the exp·shifted product for the entropy
    (3 fp32 buffers), and at the start of backward two fp32 gradient buffers of the same shape live at
    once (d/d exp and d/d shifted): s·b·V/t·(e + 5·4) bytes. Korthikanti §4 counts the logits buffer
    separately from the layers, too; with large V it is the biggest activation term."""
    return s * b * dims.vocab / tensor * (e + 5 * FP32)


def kv_cache_bytes(
    dims: Dims, *, sequences: int, tokens: int, e: int, rollout_tensor: int, rollout_pipeline: int
) -> float:
    """K and V of every generated sequence on one generation rank:
    2 · (L/p_g) · max(1, g/t_g) · d · e · sequences · tokens (kv heads replicate when t_g > g, as vLLM
    does)."""
    kv_heads = max(1, dims.kv_heads // rollout_tensor)
    return 2 * (dims.layers // rollout_pipeline) * kv_heads * dims.head_dim * e * sequences * tokens


def reshard_receive_bytes(split_bytes: float, tensor: int, pipeline: int, rt: int, rp: int) -> float:
    """HybridFlow Table 2 (micro-DP all-gather): each rank receives M/(t_g·p_g) − M/(t·p), where M is
    the bytes of the model-parallel-split parameters of the whole model (replicated ones need no
    transfer)."""
    return split_bytes / (rt * rp) - split_bytes / (tensor * pipeline)


def optimizer_bytes_per_param(dtype: str) -> tuple[int, int]:
    """(AdamW state bytes, fp32 master-copy bytes) per parameter: 2 fp32 moments always; a master copy
    only when the parameters are 16-bit (ZeRO §3.1's K = 12 bytes for mixed precision)."""
    return 2 * FP32, (FP32 if DTYPE_BYTES[dtype] < FP32 else 0)
