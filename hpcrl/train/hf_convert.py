"""Megatron GPTModel <-> Hugging Face (Llama / Qwen2) conversion: configs, full state dicts, TP shards.

Pure tensor code, no process groups. The reshard engine reuses the per-tensor helpers to convert
per shard for rollout TP; hpcrl.train.model uses them to load an HF directory into a (TP/PP-sharded)
GPTModel and to export one.

Public functions
- `validate_model_config(cfg)`                    -> list of Problems (family/bias/heads rules)
- `model_config_to_hf(cfg)`                       -> LlamaConfig | Qwen2Config
- `model_config_from_hf(hf_config, **overrides)`  -> ModelConfig
- `hf_to_megatron_state_dict(hf_sd, cfg)`         -> full (TP=1, all layers) Megatron state dict
- `megatron_to_hf_state_dict(mg_sd, cfg)`         -> HF state dict (strict-loadable)
- `megatron_to_hf_tensor(name, tensor, cfg)`      -> [(hf_name, tensor)] for one full Megatron tensor
- `tp_split_dim(name)`                            -> dim a Megatron tensor is TP-split on, or None
- `shard_for_tp(name, full, tp_rank, tp_size)`    -> this TP rank's shard of a full Megatron tensor
- `gather_tp_shards(name, shards)`                -> the full tensor from all TP ranks' shards (in order)
- `layer_index(name)` / `with_layer_index(name, i)` -> read/replace the decoder layer number

Layouts (docs/FACTS.md "megatron-core <-> Hugging Face parity"); NH query heads, NG kv groups, HD head dim:
- `linear_qkv.weight` [(NH + 2 NG) HD, H]: NG groups, each [q rows of its NH/NG heads; k; v].
  A TP shard holds whole groups (dim 0), so a plain dim-0 concatenation of shards restores it.
- `linear_fc1.weight` [2 FFN, H] = [gate; up]; a TP shard is [gate_r; up_r], so gates and ups are
  split/gathered separately.
- `word_embeddings` / `output_layer` are vocab rows (dim 0); `linear_qkv`, `linear_fc1` are column
  parallel (dim 0); `linear_proj`, `linear_fc2` are row parallel (dim 1); norms are replicated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from hpcrl.errors import ConfigError, Problem
from hpcrl.train.config import ModelConfig
from hpcrl.train.hf_config import architecture_from_hf

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

# per-layer Megatron suffix -> HF suffix (the layer prefixes are decoder.layers.i. / model.layers.i.)
_LAYER_SIMPLE = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_TOP_SIMPLE = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}
_COLUMN_PARALLEL = (
    "self_attention.linear_qkv.weight",
    "self_attention.linear_qkv.bias",
    "mlp.linear_fc1.weight",
)
_ROW_PARALLEL = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
_VOCAB_PARALLEL = ("embedding.word_embeddings.weight", "output_layer.weight")


def head_dim(cfg: ModelConfig) -> int:
    return cfg.hidden_size // cfg.num_attention_heads


def validate_model_config(cfg: ModelConfig, key: str = "model") -> list[Problem]:
    """Architecture rules that both Megatron and HF need; each Problem names the dotted key."""
    problems = []
    if cfg.hidden_size % cfg.num_attention_heads:
        problems.append(Problem("hidden_size must divide by num_attention_heads", key=f"{key}.hidden_size"))
    if cfg.num_attention_heads % cfg.num_query_groups:
        problems.append(
            Problem("num_attention_heads must divide by num_query_groups", key=f"{key}.num_query_groups")
        )
    if cfg.family == "qwen2" and not cfg.qkv_bias:
        problems.append(Problem("qwen2 always has q/k/v biases: set qkv_bias: true", key=f"{key}.qkv_bias"))
    if cfg.family == "llama" and cfg.qkv_bias:
        problems.append(
            Problem(
                "llama has no q/k/v-only bias (HF attention_bias also biases o_proj); use family: qwen2",
                key=f"{key}.qkv_bias",
            )
        )
    return problems


def model_config_to_hf(cfg: ModelConfig):
    """The HF config (LlamaConfig or Qwen2Config) of the same architecture."""
    from transformers import LlamaConfig, Qwen2Config

    problems = validate_model_config(cfg)
    if problems:
        raise ConfigError(problems)
    common = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.ffn_hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_query_groups,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        hidden_act="silu",
        attention_dropout=0.0,
        dtype=cfg.dtype,
    )
    if cfg.family == "llama":
        return LlamaConfig(**common, head_dim=head_dim(cfg), attention_bias=False, mlp_bias=False)
    return Qwen2Config(**common, use_sliding_window=False)


def model_config_from_hf(hf_config, **overrides) -> ModelConfig:
    """A ModelConfig read from an HF LlamaConfig / Qwen2Config (its keys mapped by
    hpcrl.train.hf_config, as the planner maps a raw config.json); `overrides` set the other fields."""
    fields = architecture_from_hf(hf_config.to_dict())
    dtype = getattr(hf_config, "dtype", None) or "float32"
    fields["dtype"] = str(dtype).removeprefix("torch.")
    fields.update(overrides)
    return ModelConfig(**fields)


def layer_index(name: str) -> int | None:
    """The decoder layer number in a Megatron name, or None for embedding/final norm/output."""
    match = _LAYER.match(name)
    return int(match.group(1)) if match else None


def with_layer_index(name: str, index: int) -> str:
    """`name` with its decoder layer number replaced (local <-> global under pipeline parallelism)."""
    match = _LAYER.match(name)
    if not match:
        raise ValueError(f"{name!r} is not a decoder layer tensor")
    return f"decoder.layers.{index}.{match.group(2)}"


def _qkv_sizes(cfg: ModelConfig) -> tuple[int, int, int]:
    hd = head_dim(cfg)
    return cfg.num_query_groups, cfg.num_attention_heads // cfg.num_query_groups * hd, hd


def split_qkv(qkv: torch.Tensor, cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Full `linear_qkv` weight [(NH+2NG)HD, H] or bias [(NH+2NG)HD] -> HF (q, k, v)."""
    ng, q_rows, hd = _qkv_sizes(cfg)
    grouped = qkv.reshape(ng, q_rows + 2 * hd, *qkv.shape[1:])
    q, k, v = grouped.split([q_rows, hd, hd], dim=1)
    return (t.reshape(-1, *qkv.shape[1:]) for t in (q, k, v))


def merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """HF q/k/v (weights [rows, H] or biases [rows]) -> Megatron's per-group interleaved `linear_qkv`."""
    ng, q_rows, hd = _qkv_sizes(cfg)
    rest = q.shape[1:]
    grouped = torch.cat([q.reshape(ng, q_rows, *rest), k.reshape(ng, hd, *rest), v.reshape(ng, hd, *rest)], 1)
    return grouped.reshape(-1, *rest)


def megatron_to_hf_tensor(
    name: str, tensor: torch.Tensor, cfg: ModelConfig
) -> list[tuple[str, torch.Tensor]]:
    """One full (TP-gathered) Megatron tensor with its *global* name -> its HF (name, tensor) pairs."""
    if name in _TOP_SIMPLE:
        return [(_TOP_SIMPLE[name], tensor)]
    match = _LAYER.match(name)
    if not match:
        raise KeyError(f"no HF name for Megatron tensor {name!r}")
    i, suffix = match.groups()
    prefix = f"model.layers.{i}."
    if suffix in _LAYER_SIMPLE:
        return [(prefix + _LAYER_SIMPLE[suffix], tensor)]
    if suffix in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = suffix.rsplit(".", 1)[1]
        q, k, v = split_qkv(tensor, cfg)
        return [(f"{prefix}self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v), strict=True)]
    if suffix == "mlp.linear_fc1.weight":
        gate, up = tensor.chunk(2, dim=0)
        return [(prefix + "mlp.gate_proj.weight", gate), (prefix + "mlp.up_proj.weight", up)]
    raise KeyError(f"no HF name for Megatron tensor {name!r}")


def megatron_to_hf_state_dict(mg_sd: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Full Megatron state dict (TP=1, global layer numbers) -> HF state dict.

    Non-tensor entries (`*._extra_state`) are skipped. With tied embeddings `lm_head.weight` is the
    embedding tensor itself (HF's state_dict lists both names for the one tied tensor).
    """
    hf_sd: dict[str, torch.Tensor] = {}
    for name, tensor in mg_sd.items():
        if not isinstance(tensor, torch.Tensor) or name.endswith("_extra_state"):
            continue
        if cfg.tie_word_embeddings and name == "output_layer.weight":
            continue
        hf_sd.update(megatron_to_hf_tensor(name, tensor, cfg))
    if cfg.tie_word_embeddings and "model.embed_tokens.weight" in hf_sd:
        hf_sd["lm_head.weight"] = hf_sd["model.embed_tokens.weight"]
    return hf_sd


def hf_to_megatron_state_dict(
    hf_sd: Mapping[str, torch.Tensor], cfg: ModelConfig, *, output_layer: bool = True
) -> dict[str, torch.Tensor]:
    """HF state dict -> full Megatron state dict (TP=1, global layer numbers). Raises KeyError naming a
    missing HF tensor. `output_layer` False: the model has no LM head to fill (a scalar-head model, whose
    HF `*ForSequenceClassification` directory holds `score.weight` instead of `lm_head.weight`)."""

    def get(key: str) -> torch.Tensor:
        if key not in hf_sd:
            raise KeyError(f"HF state dict lacks {key!r} (family {cfg.family}, {cfg.num_layers} layers)")
        return hf_sd[key]

    mg: dict[str, torch.Tensor] = {}
    for mg_name, hf_name in _TOP_SIMPLE.items():
        if mg_name == "output_layer.weight" and (cfg.tie_word_embeddings or not output_layer):
            continue
        mg[mg_name] = get(hf_name)
    for i in range(cfg.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for mg_suffix, hf_suffix in _LAYER_SIMPLE.items():
            mg[dst + mg_suffix] = get(src + hf_suffix)
        attn = src + "self_attn."
        mg[dst + "self_attention.linear_qkv.weight"] = merge_qkv(
            *(get(f"{attn}{p}_proj.weight") for p in "qkv"), cfg
        )
        if cfg.qkv_bias:
            mg[dst + "self_attention.linear_qkv.bias"] = merge_qkv(
                *(get(f"{attn}{p}_proj.bias") for p in "qkv"), cfg
            )
        mg[dst + "mlp.linear_fc1.weight"] = torch.cat(
            [get(src + "mlp.gate_proj.weight"), get(src + "mlp.up_proj.weight")]
        )
    return mg


def _suffix(name: str) -> str:
    match = _LAYER.match(name)
    return match.group(2) if match else name


def tp_split_dim(name: str) -> int | None:
    """The dim along which a Megatron tensor is split across TP ranks; None when replicated."""
    suffix = _suffix(name)
    if suffix in _COLUMN_PARALLEL or suffix in _VOCAB_PARALLEL:
        return 0
    if suffix in _ROW_PARALLEL:
        return 1
    return None


def shard_for_tp(name: str, full: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """TP rank `tp_rank`'s shard of the full Megatron tensor `name` (gate/up split separately for fc1)."""
    dim = tp_split_dim(name)
    if dim is None or tp_size == 1:
        return full
    if full.shape[dim] % tp_size:
        raise ValueError(f"{name}: dim {dim} of size {full.shape[dim]} does not divide by TP={tp_size}")
    if _suffix(name) == "mlp.linear_fc1.weight":
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp_size)[tp_rank], up.chunk(tp_size)[tp_rank]])
    return full.chunk(tp_size, dim=dim)[tp_rank]


def gather_tp_shards(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The full Megatron tensor from the shards of TP ranks 0..t-1 (replicated: the first shard)."""
    dim = tp_split_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if _suffix(name) == "mlp.linear_fc1.weight":
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([torch.cat([g for g, _ in halves]), torch.cat([u for _, u in halves])])
    return torch.cat(shards, dim=dim)
