"""Describe a megatron-core training worker (hpcrl.train.trainer.Trainer) as checkpoint shards, and load
a checkpoint back into one under any (t, p, d).

Naming (the contract the HF export relies on), with `prefix` e.g. "actor.":
    {prefix}{global megatron name}                   parameter (layer numbers global, as at p=1)
    {prefix}{...}.linear_fc1.weight.gate / .up       megatron's fused fc1: the TP shard [gate_r; up_r] is not
                                                     one hyperslab of [gate; up], so it is two logical tensors
    {prefix}optim.{exp_avg|exp_avg_sq}.{name}        AdamW state, sharded exactly like the parameter
    {prefix}optim.step.{name}                        AdamW step count (scalar, replicated)
TP-split dims come from hpcrl.train.hf_convert.tp_split_dim (partition {"tp": dim}); pipeline stages hold
different global layer names, so nothing is split by PP; DP replicas and the last stage's copy of a tied
embedding are replicas, written once. The model config is stored in the manifest's extra["models"][prefix].
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from hpcrl.ckpt.manifest import Manifest
from hpcrl.ckpt.shards import ShardedTensor, ShardSpec
from hpcrl.train import hf_convert
from hpcrl.train.model import is_tied, named_global_params

_FC1 = "mlp.linear_fc1.weight"
_ADAM_TENSORS = ("exp_avg", "exp_avg_sq")


def model_extra(trainer, prefix: str) -> dict[str, Any]:
    """Manifest `extra` entry that lets `hpcrl ckpt export` rebuild the HF config."""
    return {"models": {prefix: asdict(trainer.model_cfg)}}


def _param_pieces(name: str, local: torch.Tensor, tp_rank: int, tp_size: int):
    """(checkpoint name suffix, local view, global shape, global offset, partition) of one parameter."""
    dim = hf_convert.tp_split_dim(name)
    if name.endswith(_FC1):
        half = local.shape[0] // 2
        shape = (half * tp_size, *local.shape[1:])
        offset = (half * tp_rank, *(0,) * (local.dim() - 1))
        return [
            (f"{name}.gate", local[:half], shape, offset, {"tp": 0}),
            (f"{name}.up", local[half:], shape, offset, {"tp": 0}),
        ]
    if dim is None or name == "value_head.weight":
        return [(name, local, tuple(local.shape), (0,) * local.dim(), {})]
    shape = list(local.shape)
    shape[dim] *= tp_size
    offset = [0] * local.dim()
    offset[dim] = local.shape[dim] * tp_rank
    return [(name, local, tuple(shape), tuple(offset), {"tp": dim})]


def _params(trainer):
    """(global name, parameter); the last stage's tied output copy is named as the embedding (a replica)."""
    for name, param in named_global_params(trainer.model, trainer.model_cfg, trainer.groups, tied_copy=True):
        if name == "output_layer.weight" and is_tied(trainer.model):
            name = "embedding.word_embeddings.weight"
        yield name, param


def trainer_shards(trainer, prefix: str = "actor.") -> list[ShardedTensor]:
    """Parameters and (when it exists) AdamW state of this rank, as shards of global tensors."""
    groups = trainer.groups
    shards = []
    for name, param in _params(trainer):
        state = trainer.optimizer.state.get(param, {}) if trainer.optimizer is not None else {}
        sources = [(prefix, param.detach())]
        sources += [(f"{prefix}optim.{key}.", state[key]) for key in _ADAM_TENSORS if key in state]
        for head, tensor in sources:
            for suffix, view, shape, offset, part in _param_pieces(
                name, tensor, groups.tp_rank, groups.tensor
            ):
                shards.append(ShardedTensor(head + suffix, view, shape, offset, part))
        if "step" in state:
            shards.append(ShardedTensor.whole(f"{prefix}optim.step.{name}", state["step"].reshape(())))
    return shards


def trainer_specs(trainer, manifest: Manifest, prefix: str = "actor.") -> list[ShardSpec]:
    """What this rank loads: its parameter shards, plus AdamW state when the checkpoint has it."""
    return [s.spec for s in _descriptors(trainer, manifest, prefix)]


def _descriptors(trainer, manifest: Manifest, prefix: str) -> list[ShardedTensor]:
    groups = trainer.groups
    out = []
    for name, param in _params(trainer):
        heads = [prefix] + [
            f"{prefix}optim.{key}."
            for key in _ADAM_TENSORS
            if f"{prefix}optim.{key}.{_first(name)}" in manifest.tensors
        ]
        for head in heads:
            for suffix, view, shape, offset, part in _param_pieces(
                name, param.detach(), groups.tp_rank, groups.tensor
            ):
                out.append(ShardedTensor(head + suffix, view, shape, offset, part))
        if f"{prefix}optim.step.{name}" in manifest.tensors:
            out.append(
                ShardedTensor.whole(f"{prefix}optim.step.{name}", torch.zeros((), dtype=torch.float32))
            )
    return out


def _first(name: str) -> str:
    return f"{name}.gate" if name.endswith(_FC1) else name


def load_into_trainer(trainer, tensors: dict[str, torch.Tensor], prefix: str = "actor.") -> None:
    """Copy loaded shards (from `trainer_specs`) into the parameters and the AdamW state."""
    with torch.no_grad():
        for name, param in _params(trainer):
            param.copy_(_assemble(tensors, prefix, name, param))
            if trainer.optimizer is None or f"{prefix}optim.step.{name}" not in tensors:
                continue
            state = trainer.optimizer.state[param]
            for key in _ADAM_TENSORS:
                state[key] = _assemble(tensors, f"{prefix}optim.{key}.", name, param).clone()
            state["step"] = tensors[f"{prefix}optim.step.{name}"].clone()


def _assemble(tensors: dict[str, torch.Tensor], head: str, name: str, like: torch.Tensor) -> torch.Tensor:
    if name.endswith(_FC1):
        return torch.cat([tensors[f"{head}{name}.gate"], tensors[f"{head}{name}.up"]]).to(like.dtype)
    return tensors[head + name].to(like.dtype)
