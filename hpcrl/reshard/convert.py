"""Megatron generation shard -> HF/vLLM names and layouts, per rollout-TP shard; the hand-off to rollout.

The generation shard of rank g (of t_g) is in Megatron's layout at TP = t_g. Each tensor converts
independently with the per-tensor helpers of hpcrl.train.hf_convert (the one home of the name map),
applied to a *shard view* of the config: a shard holds NH/t_g query heads in NG/t_g whole kv groups
(the layout requires NG % t_g == 0), so `linear_qkv` splits into its q/k/v rows exactly as the full
tensor does, and `linear_fc1` = [gate_g; up_g] splits in halves.

The result equals what vLLM's loader takes for TP rank g from the full HF checkpoint (`vllm_shard` below
is that slicing, used as the reference in tests): q heads [g·NH/t_g, (g+1)·NH/t_g), kv heads
[g·NG/t_g, ...) (a kv head index g // (t_g/NG) replicated when t_g > NG), gate/up rows and embedding /
lm_head vocab rows cut on dim 0, o_proj/down_proj cut on dim 1, norms whole. vLLM pads the vocabulary
to a multiple of 64·t_g before cutting; the hand-off cuts the unpadded vocab V/t_g, which is the same
rows whenever V % (64·t_g) == 0 (a rollout engine copies rows [0, V/t_g) of its padded shard otherwise).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from hpcrl.distributed.layout import ParallelLayout, RolloutCoords
from hpcrl.train import hf_convert
from hpcrl.train.config import ModelConfig


def shard_config(cfg: ModelConfig, rollout_tensor: int) -> ModelConfig:
    """The config as seen by one generation-TP shard: NH/t_g heads, NG/t_g kv groups, same head dim."""
    if rollout_tensor == 1:
        return cfg
    hd = hf_convert.head_dim(cfg)
    heads = cfg.num_attention_heads // rollout_tensor
    return dataclasses.replace(
        cfg,
        num_attention_heads=heads,
        num_query_groups=cfg.num_query_groups // rollout_tensor,
        hidden_size=heads * hd,
    )


def megatron_shard_to_hf(name: str, tensor: torch.Tensor, cfg: ModelConfig, rollout_tensor: int):
    """One generation-shard tensor (global Megatron name) -> [(hf_name, shard tensor)]."""
    return hf_convert.megatron_to_hf_tensor(name, tensor, shard_config(cfg, rollout_tensor))


def hf_shard_to_megatron(
    items: Iterable[tuple[str, torch.Tensor]],
    megatron_names: Iterable[str],
    cfg: ModelConfig,
    rollout_tensor: int,
) -> dict[str, torch.Tensor]:
    """Inverse of `megatron_shard_to_hf` for the given Megatron names (tests, reloading rollout shards)."""
    scfg = shard_config(cfg, rollout_tensor)
    hf = dict(items)
    out = {}
    for name in megatron_names:
        probe = torch.zeros(_probe_rows(name, scfg), 1)
        hf_names = [n for n, _ in hf_convert.megatron_to_hf_tensor(name, probe, scfg)]
        parts = [hf[n] for n in hf_names]
        if len(parts) == 3:
            out[name] = hf_convert.merge_qkv(*parts, scfg)
        elif len(parts) == 2:
            out[name] = torch.cat(parts)
        else:
            out[name] = parts[0]
    return out


def _probe_rows(name: str, scfg: ModelConfig) -> int:
    """Rows of a dummy tensor that `megatron_to_hf_tensor` can split like `name` (only names matter)."""
    if "linear_qkv" in name:
        return (scfg.num_attention_heads + 2 * scfg.num_query_groups) * hf_convert.head_dim(scfg)
    return 2


def vllm_shard(
    hf_name: str, full: torch.Tensor, cfg: ModelConfig, rollout_tensor: int, rank: int
) -> torch.Tensor:
    """The slice of a full HF tensor that vLLM's weight loader keeps on TP rank `rank` (without vocab padding)."""
    t_g, hd = rollout_tensor, hf_convert.head_dim(cfg)
    leaf = hf_name.rsplit(".", 2)[-2]
    if leaf == "q_proj":
        heads = cfg.num_attention_heads // t_g
        return full[rank * heads * hd : (rank + 1) * heads * hd]
    if leaf in ("k_proj", "v_proj"):
        ng = cfg.num_query_groups
        if t_g <= ng:
            per = ng // t_g
            return full[rank * per * hd : (rank + 1) * per * hd]
        head = rank // (t_g // ng)  # replicated kv head
        return full[head * hd : (head + 1) * hd]
    if leaf in ("gate_proj", "up_proj", "embed_tokens", "lm_head"):
        return full.chunk(t_g, dim=0)[rank]
    if leaf in ("o_proj", "down_proj"):
        return full.chunk(t_g, dim=1)[rank]
    return full  # norms


@dataclass(frozen=True)
class NamedShard:
    """A generation shard held as named tensors (global Megatron name -> generation-shard tensor), read
    like the reshard engine's GenerationShard (`megatron_tensors()`): one received from another pool
    (hpcrl.reshard.cross_pool_transfer, the async placement's back buffer)."""

    tensors: Mapping[str, torch.Tensor]

    def megatron_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.tensors.items())


@dataclass
class RolloutWeights:
    """The hand-off to a rollout engine: this rank's generation shard as (hf_name, tensor) pairs.

    `layout` and `coords` say which shard it is (generation TP rank coords.tensor of t_g, pipeline stage
    coords.pipeline of p_g). Iterate once per weight sync; tensors may be views of the reshard buffers and
    are valid until the engine's `to_training`. With tied embeddings `lm_head` is not yielded (HF/vLLM tie
    it to `embed_tokens`).
    """

    layout: ParallelLayout
    coords: RolloutCoords
    cfg: ModelConfig
    shard: object
    """A GenerationShard (or NaiveGenerationShard): anything with `megatron_tensors()`."""

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.shard.megatron_tensors():
            if name == "output_layer.weight" and self.cfg.tie_word_embeddings:
                continue
            yield from megatron_shard_to_hf(name, tensor, self.cfg, self.layout.rollout_tensor)


def rollout_weights(shard, layout: ParallelLayout, rank: int, cfg: ModelConfig) -> RolloutWeights:
    """Wrap a generation shard of `rank` for a rollout engine (vLLM `load_weights`-style or HF)."""
    return RolloutWeights(layout=layout, coords=layout.rollout_coords(rank), cfg=cfg, shard=shard)
