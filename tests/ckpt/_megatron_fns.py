"""Rank functions: a real megatron-core policy trainer saved at one layout and resumed at another."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.commit import read_latest
from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import read_manifest
from hpcrl.ckpt.megatron import load_into_trainer, model_extra, trainer_shards, trainer_specs
from hpcrl.ckpt.state import RunState
from hpcrl.train.config import OptimizerConfig
from hpcrl.train.model import build_train_groups, gather_full_state_dict, load_full_state_dict
from hpcrl.train.trainer import build_policy_trainer
from tests.train._rank_fns import policy_loss, random_full_state_dict, tiny_batch, tiny_config

OPTIM = OptimizerConfig(lr=1e-2, grad_clip=1e9, micro_batch_size=2)


def _trainer(tensor: int, pipeline: int, tie: bool):
    groups = build_train_groups(tensor, pipeline, 1)
    cfg = tiny_config("qwen2", tie_word_embeddings=tie)
    return build_policy_trainer(cfg, OPTIM, groups), cfg, groups


def train_save_train(rank: int, world_size: int, root: str, tensor: int, pipeline: int, tie: bool) -> dict:
    """2 updates, checkpoint, 2 more updates: the uninterrupted reference for a resume after step 2."""
    trainer, cfg, groups = _trainer(tensor, pipeline, tie)
    load_full_state_dict(trainer.model, random_full_state_dict(cfg, seed=11), cfg, groups)
    batches = [tiny_batch(cfg, seed=s) for s in range(4)]
    losses = [trainer.update(batches[i], policy_loss)["loss"] for i in range(2)]
    ck = Checkpointer(root, group=dist.group.WORLD, async_save=False)
    ck.save(
        2,
        trainer_shards(trainer),
        RunState(step=2),
        layout={"t": tensor, "p": pipeline, "d": 1},
        extra=model_extra(trainer, "actor."),
    )
    losses += [trainer.update(batches[i], policy_loss)["loss"] for i in range(2, 4)]
    return {"losses": losses, "weights": gather_full_state_dict(trainer.model, cfg, groups)}


def resume_train(rank: int, world_size: int, root: str, tensor: int, pipeline: int, tie: bool) -> dict:
    """Fresh trainer at another layout (different init), load the checkpoint, 2 updates."""
    trainer, cfg, groups = _trainer(tensor, pipeline, tie)
    manifest = read_manifest(read_latest(__import__("pathlib").Path(root)))
    loaded = load_checkpoint(root, trainer_specs(trainer, manifest), group=dist.group.WORLD)
    load_into_trainer(trainer, loaded.tensors)
    batches = [tiny_batch(cfg, seed=s) for s in range(4)]
    losses = [trainer.update(batches[i], policy_loss)["loss"] for i in range(2, 4)]
    return {
        "losses": losses,
        "weights": gather_full_state_dict(trainer.model, cfg, groups),
        "bytes_read": loaded.bytes_read,
        "shard_bytes": sum(s.nbytes for s in trainer_specs(trainer, manifest)),
    }


def megatron_logits(rank: int, world_size: int, root: str, hf_dir: str) -> float:
    """Max |logits(megatron t=1 model loaded from the checkpoint) - logits(HF model from the export)|."""
    from transformers import AutoModelForCausalLM

    from hpcrl.train.model import forward_logits

    trainer, cfg, _ = _trainer(1, 1, False)
    manifest = read_manifest(read_latest(__import__("pathlib").Path(root)))
    load_into_trainer(trainer, load_checkpoint(root, trainer_specs(trainer, manifest)).tensors)
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager")
    batch = tiny_batch(cfg)
    with torch.no_grad():
        ours = forward_logits(trainer.model, batch.input_ids_BT, batch.attention_mask_BT)
        theirs = hf(
            input_ids=batch.input_ids_BT,
            attention_mask=batch.attention_mask_BT.long(),
            position_ids=batch.position_ids_BT,
        ).logits
    return float((ours - theirs)[batch.attention_mask_BT].abs().max())
