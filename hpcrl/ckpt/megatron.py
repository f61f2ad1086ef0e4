"""Describe a megatron-core training worker (hpcrl.train.trainer.Trainer) as checkpoint shards, and load
a checkpoint back into one under any (t, p, d).

Naming (the contract the HF export relies on), with `prefix` e.g. "actor.":
    {prefix}{global megatron name}                   parameter (layer numbers global, as at p=1)
    {prefix}{...}.linear_fc1.weight.gate / .up       megatron's fused fc1: the TP shard [gate_r; up_r] is not
                                                     one hyperslab of [gate; up], so it is two logical tensors
    {prefix}optim.{exp_avg|exp_avg_sq}.{name}        AdamW state, sharded exactly like the parameter
    {prefix}optim.step.{name}                        AdamW step count (scalar, replicated)
    {prefix}optim.master.{name}                      fp32 master weight of a 16-bit parameter (the value
                                                     AdamW steps; the parameter is its bf16/fp16 rounding)
TP-split dims come from hpcrl.train.hf_convert.tp_split_dim (partition {"tp": dim}); pipeline stages hold
different global layer names, so nothing is split by PP; DP replicas and the last stage's copy of a tied
embedding are replicas, written once. The model config is stored in the manifest's extra["models"][prefix].
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from hpcrl.ckpt.manifest import Manifest
from hpcrl.ckpt.shards import ShardedTensor, ShardSpec, torch_dtype
from hpcrl.train import hf_convert
from hpcrl.train.model import is_tied, named_global_params

_FC1 = "mlp.linear_fc1.weight"
_ADAM_TENSORS = ("exp_avg", "exp_avg_sq")
_MASTER = "master"


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
    """Parameters and (when it exists) AdamW state of this rank, as shards of global tensors.

    The optimizer state comes from `trainer.param_state` (whole per parameter whatever the update backend;
    with megatron's distributed optimizer that gathers it over DP, so every DP rank calls this)."""
    groups = trainer.groups
    shards = []
    for name, param in _params(trainer):
        state = trainer.param_state(param)
        sources = [(prefix, param.detach())]
        if _MASTER in state:
            sources.append((f"{prefix}optim.{_MASTER}.", state[_MASTER]))
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
    """What this rank loads: its parameter shards, plus AdamW state and fp32 masters when the checkpoint
    has them (in the checkpoint's dtype; `load_into_trainer` casts)."""
    return [s.spec for s in _descriptors(trainer, manifest, prefix)]


def _descriptors(trainer, manifest: Manifest, prefix: str) -> list[ShardedTensor]:
    groups = trainer.groups
    out = []
    for name, param in _params(trainer):
        optim_heads = [
            f"{prefix}optim.{key}."
            for key in (_MASTER, *_ADAM_TENSORS)
            if f"{prefix}optim.{key}.{_first(name)}" in manifest.tensors
        ]
        # the parameter in its own dtype (not needed when its master is saved: load_into_trainer takes the
        # value from the master); optimizer tensors in the checkpoint's dtype (fp32 states of a bf16 run)
        has_master = f"{prefix}optim.{_MASTER}.{_first(name)}" in manifest.tensors
        like = {} if has_master else {prefix: param.detach()}
        for head in optim_heads:
            dtype = torch_dtype(manifest.tensors[head + _first(name)].dtype)
            like[head] = torch.empty(param.shape, dtype=dtype, device="meta")
        for head, tensor in like.items():
            for suffix, view, shape, offset, part in _param_pieces(
                name, tensor, groups.tp_rank, groups.tensor
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
    """Copy loaded shards (from `trainer_specs`) into the parameters, fp32 masters and AdamW state.

    A parameter's exact value is its checkpointed master when there is one (a bf16 run), else the saved
    parameter; the trainer's parameter gets that value in its dtype and its master (if any) in fp32, so a
    bf16 resume continues bit for bit and an fp32 <-> bf16 resume loses nothing it need not."""
    with torch.no_grad():
        for name, param in _params(trainer):
            saved_master = f"{prefix}optim.{_MASTER}.{_first(name)}" in tensors
            value = _assemble(tensors, f"{prefix}optim.{_MASTER}." if saved_master else prefix, name)
            state = None
            if trainer.optimizer is not None and f"{prefix}optim.step.{name}" in tensors:
                state = {key: _assemble(tensors, f"{prefix}optim.{key}.", name) for key in _ADAM_TENSORS}
                state["step"] = tensors[f"{prefix}optim.step.{name}"]
            trainer.load_param_state(param, value, state)


def _assemble(tensors: dict[str, torch.Tensor], head: str, name: str) -> torch.Tensor:
    """The local tensor of `name` in fp32 (a master's precision; the trainer rounds it into 16-bit params)."""
    if name.endswith(_FC1):
        return torch.cat([tensors[f"{head}{name}.gate"], tensors[f"{head}{name}.up"]]).float()
    return tensors[head + name].float()
