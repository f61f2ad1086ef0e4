"""Per-parameter metadata of a megatron-core GPT model: global shape, how TP splits it, which stage holds it.

All names are *global* Megatron names (layer numbers of the p=1 model). Shapes are global (t=1).
The planner only needs this metadata, never a process group.

Split kinds (megatron-core column/row parallel linear layers; docs/FACTS.md "megatron-core <-> Hugging Face parity"):
  COLUMN     dim 0 cut into t contiguous chunks (plain column-parallel)
  VOCAB      dim 0 cut into t contiguous chunks (vocab-parallel embedding / output layer)
  QKV        dim 0 cut into t contiguous chunks of the per-query-group interleaved `linear_qkv`
             ([q (NH/NG·HD); k (HD); v (HD)] per group); `groups` = NG
  GATE_UP    `linear_fc1` [gate; up]: TP shard r is [gate_r; up_r] (gate and up cut separately)
  ROW        dim 1 cut into t contiguous chunks (row-parallel)
  REPLICATED every TP rank holds the whole tensor (norms)

The same split is read off a built model's parameters (`split_of`: megatron-core's `tensor_model_parallel`,
`partition_dim` and `partition_stride` attributes, then NAME_RULES for query groups and vocabularies), and
the reshard engine refuses to bind a parameter whose reading disagrees with the plan (`split_problems`):
a new kind of layer needs a rule, and cannot be resharded under a wrong one. The planner itself works
from this module's metadata of a ModelConfig, so that `expand`, `plan` and `rehearse` plan without a model.
GATE_UP's two blocks are `Split.parts` (megatron's partition_stride); every cut walks the parts.

Each parameter carries its dtype: a model may keep some parameters in another dtype than its matrices
(fp32 norms or MoE routers beside bf16 weights; hpcrl's dense models are one dtype, hpcrl.train.dtypes.
cast_to_model_dtype); the planner keeps one stream per dtype (hpcrl.reshard.planner).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from hpcrl.errors import ConfigError, Problem

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
"""Bytes per element of every dtype a parameter may have (torch dtype names)."""


def dtype_name(dtype: torch.dtype) -> str:
    """ "bfloat16" for torch.bfloat16: the names ParamMeta and ModelConfig.dtype use."""
    return str(dtype).removeprefix("torch.")


class Split(enum.Enum):
    COLUMN = "column"
    VOCAB = "vocab"
    QKV = "qkv"
    GATE_UP = "gate_up"
    ROW = "row"
    REPLICATED = "replicated"

    @property
    def dim(self) -> int | None:
        """Tensor dim cut across TP ranks; None when replicated."""
        if self is Split.REPLICATED:
            return None
        return 1 if self is Split.ROW else 0

    @property
    def parts(self) -> int:
        """Blocks stacked along `dim`, each cut into TP chunks separately (megatron's partition_stride):
        2 for GATE_UP ([gate; up]), 1 otherwise. TP shard r of c is [block_0 chunk r; block_1 chunk r; ...]."""
        return 2 if self is Split.GATE_UP else 1


@dataclass(frozen=True)
class ParamMeta:
    """One parameter of the full model."""

    name: str
    """Global Megatron name, e.g. decoder.layers.3.mlp.linear_fc1.weight."""
    shape: tuple[int, ...]
    """Global (t=1) shape."""
    split: Split
    stage: int
    """Training pipeline stage that holds it."""
    groups: int = 0
    """QKV only: number of query groups NG (kv heads)."""
    dtype: str = "float32"
    """torch dtype name of the parameter (one of ITEMSIZE)."""

    @property
    def numel(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n

    def shard_shape(self, count: int) -> tuple[int, ...]:
        """Shape of one of `count` TP shards."""
        dim = self.split.dim
        if dim is None:
            return self.shape
        shape = list(self.shape)
        shape[dim] //= count
        return tuple(shape)

    def shard_numel(self, count: int) -> int:
        n = 1
        for size in self.shard_shape(count):
            n *= size
        return n

    def problems(self, tensor: int, rollout_tensor: int) -> list[Problem]:
        """Rules this parameter must meet to be cut into `tensor` training and `rollout_tensor` generation
        shards. QKV: megatron-core cuts `linear_qkv` in contiguous chunks (kv groups % t == 0 or
        t % kv groups == 0); the HF/vLLM conversion needs whole kv groups per generation shard."""
        dim = self.split.dim
        if dim is None:
            return []
        if len(self.shape) <= dim:
            return [
                Problem(f"{self.split.value} split needs a dim {dim}, shape is {self.shape}", key=self.name)
            ]
        out = []
        parts = self.split.parts
        for count in sorted({tensor, rollout_tensor}):
            if self.shape[dim] % (parts * count):
                out.append(
                    Problem(
                        f"rule shape[{dim}] % {f'{parts}·' if parts > 1 else ''}tp == 0: "
                        f"{self.split.value} dim {dim} of size {self.shape[dim]} does not divide into {count} shards",
                        key=self.name,
                    )
                )
        if self.split is Split.QKV:
            if self.groups % tensor and tensor % self.groups:
                out.append(
                    Problem(
                        f"rule kv_heads % t == 0 or t % kv_heads == 0 (megatron-core): {self.groups} query groups, "
                        f"t={tensor}",
                        key=self.name,
                    )
                )
            if self.groups % rollout_tensor:
                out.append(
                    Problem(
                        f"rule kv_heads % t_g == 0: {self.groups} query groups cannot be cut into {rollout_tensor} "
                        f"generation shards of whole groups (kv-head replication for t_g > kv_heads is not supported)",
                        key=self.name,
                    )
                )
        return out


def shard_of(full: torch.Tensor, meta: ParamMeta, index: int, count: int) -> torch.Tensor:
    """TP shard `index` of `count` of the full tensor, as megatron-core lays it out (a view or a copy):
    chunk `index` of each of the split's `parts` blocks, stacked."""
    dim, parts = meta.split.dim, meta.split.parts
    if dim is None or count == 1:
        return full
    if parts == 1:
        return full.chunk(count, dim=dim)[index]
    return torch.cat([block.chunk(count, dim=dim)[index] for block in full.chunk(parts, dim=dim)], dim=dim)


def gather_shards(shards: list[torch.Tensor], meta: ParamMeta) -> torch.Tensor:
    """The full tensor from TP shards 0..count-1 (inverse of `shard_of`)."""
    dim, parts = meta.split.dim, meta.split.parts
    if dim is None or len(shards) == 1:
        return shards[0]
    if parts == 1:
        return torch.cat(shards, dim=dim)
    blocks = [shard.chunk(parts, dim=dim) for shard in shards]
    return torch.cat([torch.cat([b[part] for b in blocks], dim=dim) for part in range(parts)], dim=dim)


NAME_RULES: tuple[tuple[str, Split], ...] = (
    ("self_attention.linear_qkv.", Split.QKV),
    ("word_embeddings.", Split.VOCAB),
    ("output_layer.", Split.VOCAB),
)
"""How a dim-0 split lays its rows out where megatron's attributes cannot say (query groups, a vocabulary):
a layer of a new kind adds a rule here."""


def split_of(name: str, param: torch.Tensor) -> Split:
    """The split read off a megatron-core parameter: `tensor_model_parallel` (absent or False:
    replicated), `partition_dim` (1: row-parallel), `partition_stride` (2: the gate/up blocks of a gated
    MLP), then NAME_RULES, else column-parallel."""
    if not getattr(param, "tensor_model_parallel", False):
        return Split.REPLICATED
    if param.partition_dim == 1:
        return Split.ROW
    if getattr(param, "partition_stride", 1) == Split.GATE_UP.parts:
        return Split.GATE_UP
    return next((split for marker, split in NAME_RULES if marker in name), Split.COLUMN)


def split_problems(metas: list[ParamMeta], params: Mapping[str, torch.Tensor]) -> list[Problem]:
    """Where the split read off a held megatron parameter (an nn.Parameter; plain tensors carry no
    attributes) is not the one planned: a layer the planner's metadata does not describe."""
    planned = {m.name: m.split for m in metas}
    problems = []
    for name, param in params.items():
        if name in planned and isinstance(param, torch.nn.Parameter):
            found = split_of(name, param)
            if found is not planned[name]:
                problems.append(
                    Problem(
                        f"megatron's attributes say {found.value} (tensor_model_parallel="
                        f"{getattr(param, 'tensor_model_parallel', None)}, partition_dim="
                        f"{getattr(param, 'partition_dim', None)}, partition_stride="
                        f"{getattr(param, 'partition_stride', None)}); the plan has {planned[name].value}",
                        key=name,
                    )
                )
    return problems


def gpt_param_metas(
    model, pipeline: int = 1, *, dtype: str = "float32", norm_dtype: str | None = None
) -> list[ParamMeta]:
    """Metadata of every parameter of a megatron-core GPTModel built from a ModelConfig (local spec,
    RMSNorm, SwiGLU, no linear biases except optional q/k/v bias), layers split evenly over stages.

    `dtype`: of the matrices, embeddings and biases (megatron's params_dtype); `norm_dtype`: of the norms
    (None: `dtype`, as hpcrl builds its models).

    With tied embeddings there is no output layer entry: at p = 1 megatron has none, and at p > 1 the last
    stage's copy of the embedding is not resharded (HF/vLLM tie lm_head to embed_tokens), matching
    hpcrl.train.model.named_global_params (which skips that copy by default).
    """
    h, v, f = model.hidden_size, model.vocab_size, model.ffn_hidden_size
    nh, ng = model.num_attention_heads, model.num_query_groups
    hd = h // nh
    if model.num_layers % pipeline:
        raise ConfigError(
            Problem(
                f"rule layers % p == 0: {model.num_layers} layers, pipeline={pipeline}",
                key="model.num_layers",
            )
        )
    per_stage = model.num_layers // pipeline
    qkv_rows = (nh + 2 * ng) * hd
    norm_dtype = norm_dtype or dtype

    def meta(name: str, shape: tuple[int, ...], split: Split, stage: int, groups: int = 0) -> ParamMeta:
        kind_dtype = norm_dtype if split is Split.REPLICATED else dtype
        return ParamMeta(name, shape, split, stage, groups, kind_dtype)

    metas = [meta("embedding.word_embeddings.weight", (v, h), Split.VOCAB, 0)]
    for i in range(model.num_layers):
        stage, prefix = i // per_stage, f"decoder.layers.{i}."
        metas += [
            meta(prefix + "input_layernorm.weight", (h,), Split.REPLICATED, stage),
            meta(prefix + "self_attention.linear_qkv.weight", (qkv_rows, h), Split.QKV, stage, ng),
        ]
        if model.qkv_bias:
            metas.append(meta(prefix + "self_attention.linear_qkv.bias", (qkv_rows,), Split.QKV, stage, ng))
        metas += [
            meta(prefix + "self_attention.linear_proj.weight", (h, nh * hd), Split.ROW, stage),
            meta(prefix + "pre_mlp_layernorm.weight", (h,), Split.REPLICATED, stage),
            meta(prefix + "mlp.linear_fc1.weight", (2 * f, h), Split.GATE_UP, stage),
            meta(prefix + "mlp.linear_fc2.weight", (h, f), Split.ROW, stage),
        ]
    last = pipeline - 1
    metas.append(meta("decoder.final_layernorm.weight", (h,), Split.REPLICATED, last))
    if not model.tie_word_embeddings:
        metas.append(meta("output_layer.weight", (v, h), Split.VOCAB, last))
    return metas


def split_bytes_per_rank(metas: list[ParamMeta], tensor: int, pipeline: int) -> int | None:
    """M_split/(t·p) when every stage holds the same split bytes (the formula's assumption), else None."""
    per_stage = [0] * pipeline
    for meta in metas:
        if meta.split is not Split.REPLICATED:
            per_stage[meta.stage] += meta.shard_numel(tensor) * ITEMSIZE[meta.dtype]
    return per_stage[0] if len(set(per_stage)) == 1 else None
