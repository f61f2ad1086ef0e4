"""Rank functions of the megatron rollout engine tests (spawned ranks import them by name)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.reshard.build import ENGINE_FAMILIES, build_reshard_engine
from hpcrl.reshard.generation import GenerationStore
from hpcrl.reshard.transport import make_groups
from hpcrl.rl.handoff import ReshardHandoff
from hpcrl.rollout.base import SamplingParams, left_pad, row_seeds
from hpcrl.rollout.cache_slots import CacheSlots
from hpcrl.rollout.hf_engine import HFRolloutEngine, build_hf_causal_lm
from hpcrl.rollout.megatron_engine import MegatronRolloutEngine
from hpcrl.train.batch import TrainBatch
from hpcrl.train.config import ModelConfig
from hpcrl.train.hf_convert import megatron_to_hf_state_dict
from hpcrl.train.model import (
    build_generation_groups,
    build_train_groups,
    load_full_state_dict,
    named_global_params,
)
from hpcrl.train.trainer import build_policy_trainer

PAD, EOS = 0, 2
PROMPTS = [[1, 5, 6, 7, 15], [1, 8, 15], [1, 9, 9, 15], [1, 4, 13, 6, 15], [1, 12, 15]]
MAX_NEW_TOKENS = 6


def model_config() -> ModelConfig:
    """Tiny Llama every tested layout can split: 4 heads = 4 kv heads (t = 4), 4 layers (p = 4)."""
    return ModelConfig(
        vocab_size=16,
        hidden_size=64,
        num_layers=4,
        num_attention_heads=4,
        num_query_groups=4,
        ffn_hidden_size=128,
        max_position_embeddings=32,
    )


def random_full_state(trainer, seed: int = 7) -> dict[str, torch.Tensor]:
    """Every parameter random (norms too: megatron starts them at 1, which would hide a mix-up); the
    same full tensors on every rank."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: 0.1 * torch.randn(tensor.shape, generator=gen) + (1.0 if "layernorm" in name else 0.0)
        for name, tensor in sorted(trainer.full_state_dict().items())
    }


def _in_storage(tensor: torch.Tensor, flats: dict[str, torch.Tensor]) -> bool:
    """Whether `tensor` lies inside one of the store's flat buffers (one per dtype)."""
    for flat in flats.values():
        start = flat.data_ptr()
        end = start + flat.numel() * flat.element_size()
        if start <= tensor.data_ptr() and tensor.data_ptr() + tensor.numel() * tensor.element_size() <= end:
            return True
    return False


def _trainer_logprobs(trainer, out) -> torch.Tensor:
    """The training layout's log-probs of the generated tokens (teacher forcing, same padding)."""
    ids_BP, keep_BP = left_pad(PROMPTS, PAD)
    ids = torch.cat([ids_BP, out.response_ids_BT], dim=1)
    keep = torch.cat([keep_BP, out.response_mask_BT.long()], dim=1)
    resp = torch.cat([torch.zeros_like(keep_BP), out.response_mask_BT.long()], dim=1)
    batch = TrainBatch(input_ids_BT=ids, attention_mask_BT=keep.bool(), response_mask_BT=resp.bool())
    logprobs_BS = trainer.forward(batch, len(PROMPTS)).logprobs_BT.cpu()
    return logprobs_BS[:, ids_BP.shape[1] :] * out.response_mask_BT


def _replica_mismatch(trainer, replica: int, sampled) -> float:
    """Max |trainer - engine| log-prob over every replica's samples. The training layout scores each
    replica's output on all its ranks (TP ranks of a forward must see the same batch, as in the RL job)."""
    outputs: list = [None] * dist.get_world_size()
    dist.all_gather_object(outputs, (replica, sampled))
    worst = 0.0
    for _, out in sorted({index: (index, out) for index, out in outputs}.values(), key=lambda x: x[0]):
        worst = max(worst, float((_trainer_logprobs(trainer, out) - out.logprobs_BT).abs().max()))
    return worst


def generation_parity_rank(
    rank: int, world: int, layouts: list[tuple[int, int, int, int, int]]
) -> list[dict]:
    """For each layout: reshard a random actor into the megatron engine, check zero copy and volume,
    generate greedily and by sampling; return what the parent compares across layouts."""
    cfg = model_config()
    results = []
    for t, p, d, t_g, p_g, *bucket in layouts:  # optional 6th: reshard bucket bytes (several buckets)
        layout = ParallelLayout(tensor=t, pipeline=p, data=d, rollout_tensor=t_g, rollout_pipeline=p_g)
        groups = build_train_groups(t, p, d)
        trainer = build_policy_trainer(cfg, None, groups)
        full = random_full_state(trainer)
        load_full_state_dict(trainer.model, full, cfg, groups)
        reshard = build_reshard_engine(
            cfg,
            layout,
            dict(named_global_params(trainer.model, cfg, groups)),
            rank=rank,
            groups=make_groups(layout, ENGINE_FAMILIES),
            bucket_bytes=(bucket or [64 << 20])[0],
        )
        engine = MegatronRolloutEngine.build(cfg, build_generation_groups(layout), PAD, EOS)
        store = GenerationStore.for_engine(reshard)
        store.bind(engine.global_params())
        metrics = ReshardHandoff(reshard, store=store).publish(0)
        params = engine.global_params()
        zero_copy = all(_in_storage(param, store.flats) for param in params.values())
        greedy = engine.generate(PROMPTS, SamplingParams(max_new_tokens=MAX_NEW_TOKENS).greedy())
        sampling = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=1.0)
        sampled = engine.generate(PROMPTS, sampling, row_seeds(11, 0, len(PROMPTS)))
        # the same model decoding every row to the end (the static batch before issue 25)
        static = MegatronRolloutEngine(engine.model, cfg, engine.groups, PAD, EOS, ragged=False)
        static_sampled = static.generate(PROMPTS, sampling, row_seeds(11, 0, len(PROMPTS)))
        # continuous batching: 2 rows at once, the others join as rows finish (cache columns shifted)
        two = MegatronRolloutEngine(engine.model, cfg, engine.groups, PAD, EOS, max_rows=2)
        shifts = []
        original_shift = CacheSlots.shift

        def counting_shift(slots, keep_columns, _original=original_shift, _shifts=shifts):
            before = slots.column
            _original(slots, keep_columns)
            _shifts.extend([before - slots.column] if slots.column != before else [])

        CacheSlots.shift = counting_shift
        try:
            continuous = two.generate(PROMPTS, sampling, row_seeds(11, 0, len(PROMPTS)))
        finally:
            CacheSlots.shift = original_shift
        # the first two rows shorter than the longest prompt: the first prefill allocates the cache
        perm = [1, 2, 0, 3, 4]
        seeds = row_seeds(11, 0, len(PROMPTS))
        short_first = two.generate([PROMPTS[i] for i in perm], sampling, [seeds[i] for i in perm])
        waves = [
            engine.generate(PROMPTS[a:b], sampling, row_seeds(11, a, b - a)) for a, b in ((0, 2), (2, 5))
        ]
        torch.manual_seed(11 + layout.rollout_coords(rank).data)  # as RolloutWorker seeds a replica
        unseeded = engine.generate(PROMPTS, sampling)
        allocated = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
        store.sleep()
        freed = allocated - torch.cuda.memory_allocated() if torch.cuda.is_available() else None
        asleep = all(param.numel() == 0 for param in params.values())
        ReshardHandoff(reshard, store=store).publish(1)  # wake: the parameters point into the new buffer
        rewoken = all(_in_storage(param, store.flats) for param in params.values())
        again = engine.generate(PROMPTS, SamplingParams(max_new_tokens=MAX_NEW_TOKENS).greedy())
        results.append(
            {
                "layout": layout.describe(),
                "replica": layout.rollout_coords(rank).data,
                "zero_copy": zero_copy and rewoken and asleep,
                "store_bytes": store.nbytes,
                "freed_by_sleep": freed,
                "bytes_received": metrics["reshard/bytes_received"],
                "bound_bytes": reshard.plan.lower_bound_bytes(),
                "static_ids": static_sampled.response_ids_BT,
                "continuous_ids": continuous.response_ids_BT,
                "short_first_ids": short_first.response_ids_BT[torch.argsort(torch.tensor(perm))],
                "continuous_logprobs": continuous.logprobs_BT,
                "shifts": shifts,
                "static_logprobs": static_sampled.logprobs_BT,
                "sampled_logprobs": sampled.logprobs_BT,
                "sampled_lengths": sampled.response_mask_BT.sum(dim=1).tolist(),
                "greedy_ids": greedy.response_ids_BT,
                "greedy_logprobs": greedy.logprobs_BT,
                "greedy_again": torch.equal(again.response_ids_BT, greedy.response_ids_BT),
                "sampled_ids": sampled.response_ids_BT,
                "sampled_mismatch": _replica_mismatch(trainer, layout.rollout_coords(rank).data, sampled),
                "unseeded_ids": unseeded.response_ids_BT,
                "wave_ids": torch.cat([_widen(w.response_ids_BT) for w in waves]),
                "unseeded_mismatch": _replica_mismatch(trainer, layout.rollout_coords(rank).data, unseeded),
                "hf_greedy": _hf_reference(cfg, full),
            }
        )
        dist.barrier()
    return results


def _widen(ids_BT: torch.Tensor) -> torch.Tensor:
    """Right-pad a wave's responses to MAX_NEW_TOKENS (a wave whose rows all stopped early is shorter)."""
    return torch.nn.functional.pad(ids_BT, (0, MAX_NEW_TOKENS - ids_BT.shape[1]), value=PAD)


def _hf_reference(cfg: ModelConfig, full: dict[str, torch.Tensor]):
    """The same weights in the HF engine (one whole model, t_g = 1): greedy ids and log-probs."""
    engine = HFRolloutEngine(build_hf_causal_lm(cfg), PAD, EOS)  # on the GPU when there is one
    engine.load_weights(megatron_to_hf_state_dict(full, cfg).items())
    out = engine.generate(PROMPTS, SamplingParams(max_new_tokens=MAX_NEW_TOKENS).greedy())
    return out.response_ids_BT, out.logprobs_BT
