"""Module-level rank functions for the training tests (spawned ranks import them by name).

Every function returns plain tensors/floats; the test process compares them.
"""

from __future__ import annotations

import torch

from hpcrl.train import hf_convert
from hpcrl.train.batch import TrainBatch
from hpcrl.train.config import ModelConfig, OptimizerConfig
from hpcrl.train.model import (
    build_gpt_model,
    build_train_groups,
    forward_logits,
    gather_full_state_dict,
    load_full_state_dict,
)
from hpcrl.train.trainer import build_policy_trainer, build_value_trainer

B, T = 4, 8


def tiny_config(family: str = "llama", **overrides) -> ModelConfig:
    fields = dict(
        family=family,
        qkv_bias=family == "qwen2",
        vocab_size=32,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=64,
        max_position_embeddings=16,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def random_full_state_dict(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor of the full Megatron model random (norms and biases too: megatron's 1/0 init would
    hide norm/bias mix-ups)."""
    gen = torch.Generator().manual_seed(seed)
    h, hd = cfg.hidden_size, cfg.hidden_size // cfg.num_attention_heads
    qkv_rows = (cfg.num_attention_heads + 2 * cfg.num_query_groups) * hd
    shapes = {"embedding.word_embeddings.weight": (cfg.vocab_size, h), "decoder.final_layernorm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["output_layer.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"decoder.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "pre_mlp_layernorm.weight"] = (h,)
        shapes[p + "self_attention.linear_qkv.weight"] = (qkv_rows, h)
        if cfg.qkv_bias:
            shapes[p + "self_attention.linear_qkv.bias"] = (qkv_rows,)
        shapes[p + "self_attention.linear_proj.weight"] = (h, cfg.num_attention_heads * hd)
        shapes[p + "mlp.linear_fc1.weight"] = (2 * cfg.ffn_hidden_size, h)
        shapes[p + "mlp.linear_fc2.weight"] = (h, cfg.ffn_hidden_size)
    sd = {}
    for name, shape in sorted(shapes.items()):
        if name.endswith("norm.weight"):
            sd[name] = 1.0 + 0.3 * torch.randn(shape, generator=gen)
        else:
            sd[name] = 0.3 * torch.randn(shape, generator=gen)
    return sd


def tiny_batch(cfg: ModelConfig, seed: int = 0) -> TrainBatch:
    """B=4 sequences of T=8, rows 1 and 3 left-padded, the last 3-5 tokens of each row a response."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
    attention = torch.ones(B, T, dtype=torch.bool)
    attention[1, :2] = False
    attention[3, :1] = False
    response = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate((3, 4, 5, 3)):
        response[b, T - n :] = True
    positions = (attention.long().cumsum(1) - 1).clamp(min=0)
    extras = {
        "advantages_BT": torch.randn(B, T, generator=gen),
        "returns_BT": torch.randn(B, T, generator=gen),
    }
    return TrainBatch(
        input_ids_BT=ids,
        attention_mask_BT=attention,
        response_mask_BT=response,
        position_ids_BT=positions,
        extras=extras,
    )


def policy_loss(outputs, mb: TrainBatch):
    """Token-mean policy-gradient loss with an entropy bonus (a stand-in for PPO's loss)."""
    pg = mb.token_mean(-outputs.logprobs_BT * mb.extras["advantages_BT"])
    ent = mb.token_mean(outputs.entropy_BT)
    return pg - 0.01 * ent, {
        "entropy": ent * mb.num_global_response_tokens / max(1, int(mb.response_mask_BT.sum()))
    }


def value_loss(outputs, mb: TrainBatch):
    return mb.token_mean((outputs.values_BT - mb.extras["returns_BT"]) ** 2), {}


def hf_parity(rank: int, world_size: int) -> dict[str, float]:
    """Max |logits(Megatron) - logits(HF eager)| for llama (GQA) and qwen2 (qkv bias), fp32, all params random;
    also the HF -> Megatron round trip."""
    from transformers import AutoModelForCausalLM

    result = {}
    groups = build_train_groups(1, 1, 1)
    for family in ("llama", "qwen2"):
        for tie in (False, True):
            cfg = tiny_config(family, tie_word_embeddings=tie)
            model = build_gpt_model(cfg, groups)
            full = random_full_state_dict(cfg, seed=7)
            load_full_state_dict(model, full, cfg, groups)
            hf_sd = hf_convert.megatron_to_hf_state_dict(gather_full_state_dict(model, cfg, groups), cfg)
            hf_model = AutoModelForCausalLM.from_config(
                hf_convert.model_config_to_hf(cfg), attn_implementation="eager"
            )
            hf_model.load_state_dict(hf_sd, strict=True)
            batch = tiny_batch(cfg)
            with torch.no_grad():
                ours = forward_logits(model, batch.input_ids_BT, batch.attention_mask_BT)
                theirs = hf_model(
                    input_ids=batch.input_ids_BT,
                    attention_mask=batch.attention_mask_BT.long(),
                    position_ids=batch.position_ids_BT,
                ).logits
            keep = batch.attention_mask_BT
            key = f"{family}{'_tied' if tie else ''}"
            result[key] = float((ours - theirs)[keep].abs().max())
            back = hf_convert.hf_to_megatron_state_dict(hf_sd, cfg)
            result[key + "_roundtrip_exact"] = float(
                all(torch.equal(back[k], full[k]) for k in full) and back.keys() == full.keys()
            )
    return result


def train_snapshot(rank: int, world_size: int, tensor: int, pipeline: int, data: int, tie: bool) -> dict:
    """Policy and critic under layout p-t-d, loaded with the same full weights, on the same global batch:
    forward outputs, loss, full grads, grad norm (no clipping), and full weights after a clipped step.
    With `data` = 2 each DP rank takes half the batch."""
    groups = build_train_groups(tensor, pipeline, data)
    return _snapshot(groups, tie)


def _snapshot(groups, tie: bool) -> dict:
    cfg = tiny_config("qwen2", tie_word_embeddings=tie)
    full_batch = tiny_batch(cfg)
    batch = full_batch.dp_shard(groups.dp_rank, groups.data)
    out: dict = {}
    for kind in ("policy", "value"):
        optim = OptimizerConfig(lr=1e-2, grad_clip=1e9, micro_batch_size=2)
        build = build_policy_trainer if kind == "policy" else build_value_trainer
        trainer = build(cfg, optim, groups)
        if kind == "policy" and groups.embd is not None and tie:
            out["tied_copies_equal_at_init"] = _tied_copies_equal(trainer.model, groups)
        full = random_full_state_dict(cfg, seed=11)
        full["value_head.weight"] = 0.3 * torch.randn(
            1, cfg.hidden_size, generator=torch.Generator().manual_seed(3)
        )
        load_full_state_dict(trainer.model, full, cfg, groups)
        loss_fn = policy_loss if kind == "policy" else value_loss
        fwd = trainer.forward(batch, micro_batch_size=3)
        metrics = trainer.update(batch, loss_fn)
        grads = gather_full_state_dict(trainer.model, cfg, groups, grads=True)
        trainer.optim_cfg = OptimizerConfig(lr=1e-2, grad_clip=0.05, micro_batch_size=2)
        clipped = trainer.update(batch, loss_fn)
        weights = gather_full_state_dict(trainer.model, cfg, groups)
        out[kind] = {
            "forward": fwd.tensors(),
            "metrics": metrics,
            "grads": grads,
            "clipped": clipped,
            "weights": weights,
        }
    return out


def _tied_copies_equal(model, groups) -> bool:
    """p > 1: the first stage's embedding and the last stage's output copy after build (megatron's
    init sync, done by hpcrl.train.model.sync_tied_embedding)."""
    weight = model.shared_embedding_or_output_weight().detach()
    both = [torch.empty_like(weight) for _ in range(2)]
    torch.distributed.all_gather(both, weight.contiguous(), group=groups.embd)
    return torch.equal(both[0], both[1])


def data_parallel_and_references(rank: int, world_size: int) -> dict:
    """d=2 snapshot on 2 ranks; then rank 0 alone computes the t=1,p=1,d=1 references (untied and tied)
    and the micro-batch 1x4 vs 4x1 accumulation check."""
    groups = build_train_groups(1, 1, 2)
    solo = build_train_groups(1, 1, 1)  # collective; rank 0's own layout
    out = {"d2": _snapshot(groups, tie=False)}
    if solo is not None:
        out["ref"] = {tie: _snapshot(solo, tie) for tie in (False, True)}
        out["accumulation"] = _accumulation_check(solo)
    return out


def _accumulation_check(groups) -> dict:
    """Loss and grads of the same batch as 1 micro-batch of 4 and as 4 micro-batches of 1, on a t=1 model."""
    cfg = tiny_config("qwen2")
    batch = tiny_batch(cfg)
    result = {}
    for mbs in (4, 1):
        trainer = build_policy_trainer(
            cfg, OptimizerConfig(lr=0.0, grad_clip=0, micro_batch_size=mbs), groups
        )
        load_full_state_dict(trainer.model, random_full_state_dict(cfg, seed=11), cfg, groups)
        metrics = trainer.update(batch, policy_loss)
        result[mbs] = {
            "loss": metrics["loss"],
            "grads": gather_full_state_dict(trainer.model, cfg, groups, grads=True),
        }
    # a NaN loss must not reach the weights
    before = gather_full_state_dict(trainer.model, cfg, groups)
    trainer.optimizer.param_groups[0]["lr"] = 1e-2
    nan_metrics = trainer.update(batch, lambda out, mb: (policy_loss(out, mb)[0] * float("nan"), {}))
    after = gather_full_state_dict(trainer.model, cfg, groups)
    result["nan"] = {
        "metrics": nan_metrics,
        "unchanged": all(torch.equal(before[k], after[k]) for k in before),
    }
    return result


def tensor_parallel_and_hf_dir(rank: int, world_size: int, hf_dir: str) -> dict:
    """t=2 snapshot; plus a policy built from an HF directory at t=2: its gathered logits."""
    from hpcrl.train.model import build_model_from_hf

    groups = build_train_groups(2, 1, 1)
    out = {"t2": _snapshot(groups, tie=False)}
    model, cfg = build_model_from_hf(hf_dir, groups)
    batch = tiny_batch(cfg)
    with torch.no_grad():
        logits = forward_logits(model, batch.input_ids_BT, batch.attention_mask_BT)
    shards = [torch.empty_like(logits) for _ in range(groups.tensor)]
    torch.distributed.all_gather(shards, logits.contiguous(), group=groups.tp)
    out["hf_dir_logits"] = torch.cat(shards, dim=-1)
    out["hf_dir_config"] = cfg
    return out


def compat_probe(rank: int, world_size: int) -> dict:
    """In a fresh process: what `enable()` does when CUDA is reported available (faked by patching
    torch.cuda.is_available; no GPU here), then what it does for real on this CPU-only torch, and that a
    megatron forward then runs."""
    from unittest import mock

    from hpcrl.train import megatron_compat

    original_current_device, original_type = torch.cuda.current_device, torch.Tensor.type
    with mock.patch("torch.cuda.is_available", return_value=True):
        faked = {
            "returned": megatron_compat.enable_optimizer() or megatron_compat.enable(),
            "patches": megatron_compat.applied_patches(),
            "current_device_untouched": torch.cuda.current_device is original_current_device,
            "type_untouched": torch.Tensor.type is original_type,
        }
    real = {
        "returned": megatron_compat.enable(),
        "again": megatron_compat.enable(),
        "patches": megatron_compat.applied_patches(),
        "current_device": str(torch.cuda.current_device()),
    }
    from megatron.core.optimizer import optimizer as megatron_optimizer

    real["optimizer"] = megatron_compat.enable_optimizer()
    real["optimizer_again"] = megatron_compat.enable_optimizer()
    real["all_patches"] = megatron_compat.applied_patches()
    real["type_elsewhere"] = torch.zeros(1).type()  # this module is no megatron optimizer: torch's answer
    as_megatron = eval("lambda t: t.type()", vars(megatron_optimizer))  # a caller in that module  # noqa: S307
    real["type_in_megatron_optimizer"] = as_megatron(torch.zeros(1, dtype=torch.bfloat16))
    real["scalar_device"] = str(megatron_optimizer.torch.tensor([1.0], device="cuda").device)
    groups = build_train_groups(1, 1, 1)
    cfg = tiny_config()
    model = build_gpt_model(cfg, groups)
    batch = tiny_batch(cfg)
    logits = forward_logits(model, batch.input_ids_BT, batch.attention_mask_BT)
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker()
    with tracker.fork():
        in_fork = torch.rand(3)
    with tracker.fork():
        in_fork_again = torch.rand(3)
    return {
        "faked_cuda": faked,
        "cpu": real,
        "logits_shape": tuple(logits.shape),
        "tracker": type(tracker).__name__,
        "fork_streams_advance": not torch.equal(in_fork, in_fork_again),
    }


def cuda_update(rank: int, world_size: int) -> dict:
    """One policy update on CUDA (gpu-marked test only)."""
    from hpcrl.train import megatron_compat

    torch.cuda.set_device(rank)
    groups = build_train_groups(1, 1, 1)
    cfg = tiny_config()
    trainer = build_policy_trainer(cfg, OptimizerConfig(lr=1e-2, micro_batch_size=2), groups)
    before = gather_full_state_dict(trainer.model, cfg, groups)
    trainer.update(tiny_batch(cfg), policy_loss)
    after = gather_full_state_dict(trainer.model, cfg, groups)
    return {
        "patches": megatron_compat.applied_patches(),
        "device": str(next(trainer.model.parameters()).device),
        "weights_moved": any(not torch.equal(before[k], after[k]) for k in before),
    }
