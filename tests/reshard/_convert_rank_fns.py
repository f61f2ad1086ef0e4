"""Rank function of the conversion-by-logits test: real megatron-core GPTModel at t=2 on gloo -> reshard ->
HF LlamaForCausalLM loaded strictly from the handed-off tensors."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.reshard.convert import hf_shard_to_megatron, rollout_weights
from hpcrl.reshard.engine import HybridEngine
from hpcrl.reshard.params import gpt_param_metas, split_of
from hpcrl.reshard.planner import plan_rank
from hpcrl.reshard.transport import CountingTransport, TorchTransport, make_groups
from hpcrl.train import hf_convert
from hpcrl.train.config import ModelConfig
from hpcrl.train.logprobs import vocab_parallel_logprobs_entropy
from hpcrl.train.model import (
    build_gpt_model,
    build_train_groups,
    forward_logits,
    load_full_state_dict,
    named_global_params,
)
from tests.reshard._strategies import full_model

B, T = 3, 10


def gqa_config() -> ModelConfig:
    """Llama-style GQA (4 query heads, 2 kv heads), SwiGLU, RoPE; fp32."""
    return ModelConfig(
        family="llama",
        vocab_size=32,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=48,
        max_position_embeddings=16,
    )


def _megatron_logits(model, tokens_BT, groups) -> torch.Tensor:
    with torch.no_grad():
        logits_BTVt = forward_logits(model, tokens_BT, torch.ones_like(tokens_BT, dtype=torch.bool))
    shards = [torch.empty_like(logits_BTVt) for _ in range(groups.tensor)]
    dist.all_gather(shards, logits_BTVt.contiguous(), group=groups.tp)
    return torch.cat(shards, dim=-1)


def _train(model, cfg: ModelConfig, groups, steps: int) -> list[float]:
    """A few AdamW steps on next-token log-likelihood (vocab-parallel)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(5)
    vt = cfg.vocab_size // groups.tensor
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
        logits = forward_logits(model, tokens, torch.ones_like(tokens, dtype=torch.bool))
        logprobs, _ = vocab_parallel_logprobs_entropy(
            logits[:, :-1], tokens[:, 1:], groups.tp, groups.tp_rank * vt
        )
        loss = -logprobs.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def logits_rank(rank: int, world_size: int) -> dict:
    from transformers import AutoModelForCausalLM

    cfg = gqa_config()
    groups = build_train_groups(2, 1, 1)
    model = build_gpt_model(cfg, groups)
    metas = gpt_param_metas(cfg, pipeline=1)
    # random norms too: megatron's init (norms 1) could not catch a norm mix-up
    full = {k: 0.3 * v for k, v in full_model(metas, dtype=torch.float32, seed=3).items()}
    load_full_state_dict(model, full, cfg, groups)

    to_full = ParallelLayout(tensor=2, rollout_tensor=1)
    to_half = ParallelLayout(tensor=2, rollout_tensor=2)
    engine = HybridEngine(
        plan_rank(to_full, metas, rank, bucket_bytes=4096),
        CountingTransport(TorchTransport()),
        make_groups(to_full, ("micro_data",)),
    )
    params = dict(named_global_params(model, cfg, groups))
    splits = {name: split_of(name, param).value for name, param in params.items()}
    engine.attach(params)  # read in place at every transition: training updates what it reads
    before = {k: v.detach().clone() for k, v in params.items()}
    losses = _train(model, cfg, groups, steps=3)
    trained = any(not torch.equal(before[k], engine.shards.params[k]) for k in before)

    tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(11))
    megatron_logits = _megatron_logits(model, tokens, groups)

    shard = engine.to_generation()
    handed = rollout_weights(shard, to_full, rank, cfg)
    hf_full = {name: tensor.clone() for name, tensor in handed}
    mg_gen = {name: tensor.clone() for name, tensor in shard.megatron_tensors()}
    inverse_ok = all(
        torch.equal(v, mg_gen[k]) for k, v in hf_shard_to_megatron(hf_full.items(), mg_gen, cfg, 1).items()
    )
    engine.to_training(shard)
    hf_model = AutoModelForCausalLM.from_config(
        hf_convert.model_config_to_hf(cfg), attn_implementation="eager"
    )
    hf_model.load_state_dict(hf_full, strict=True)
    with torch.no_grad():
        hf_logits = hf_model(input_ids=tokens).logits

    half_engine = HybridEngine(
        plan_rank(to_half, metas, rank, bucket_bytes=4096),
        CountingTransport(TorchTransport()),
        {},
        shards=engine.shards,
    )
    half_shard = half_engine.to_generation()
    handed_half = rollout_weights(half_shard, to_half, rank, cfg)
    hf_half = {name: tensor.clone() for name, tensor in handed_half}
    mg_half = {name: tensor.clone() for name, tensor in half_shard.megatron_tensors()}
    half_inverse_ok = all(
        torch.equal(v, mg_half[k]) for k, v in hf_shard_to_megatron(hf_half.items(), mg_half, cfg, 2).items()
    )
    half_engine.to_training(half_shard)
    return {
        "losses": losses,
        "trained": trained,
        "max_abs_diff": (hf_logits - megatron_logits).abs().max().item(),
        "hf_full": hf_full,
        "hf_half": hf_half,
        "coords": tuple(handed_half.coords),
        "inverse_ok": inverse_ok,
        "half_inverse_ok": half_inverse_ok,
        "half_received": half_engine.transport.total().bytes_received,
        "splits": splits,
    }
