"""Rank function of the multi-turn episode tests (spawned ranks import it by name)."""

from __future__ import annotations

from pathlib import Path

import torch

from hpcrl.data.tasks import ALPHABET
from hpcrl.data.tokenizer import build_char_tokenizer
from hpcrl.distributed.layout import ParallelLayout
from hpcrl.env.pool import EnvPool
from hpcrl.reshard.build import ENGINE_FAMILIES, build_reshard_engine
from hpcrl.reshard.generation import GenerationStore
from hpcrl.reshard.transport import make_groups
from hpcrl.rl.episodes import (
    EpisodeCodec,
    EpisodeLimits,
    EpisodeRunner,
    build_episode_runner,
    generation_replica,
)
from hpcrl.rl.handoff import ReshardHandoff
from hpcrl.rollout.base import SamplingParams, left_pad, row_seeds
from hpcrl.rollout.config import RolloutConfig
from hpcrl.rollout.hf_engine import HFRolloutEngine, build_hf_causal_lm
from hpcrl.rollout.megatron_engine import MegatronRolloutEngine
from hpcrl.train.batch import TrainBatch
from hpcrl.train.hf_convert import megatron_to_hf_state_dict
from hpcrl.train.model import (
    build_generation_groups,
    build_train_groups,
    load_full_state_dict,
    named_global_params,
)
from hpcrl.train.trainer import build_policy_trainer
from tests.rollout._megatron_rank_fns import model_config, random_full_state

ECHO = f"{Path(__file__).resolve().parents[1] / 'env' / '_envs.py'}:Echo"
PROMPTS = ["412=", "07=", "9=", "3321="]
LIMITS = EpisodeLimits(max_turns=3, max_observation_tokens=2, width=3 * (4 + 2))


def episode_runner(tokenizer, interleave: bool = True) -> EpisodeRunner:
    pool = EnvPool(ECHO, timeout_s=30.0, env_args={"turns": 3})
    codec = EpisodeCodec(
        encode_observation=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
    )
    return EpisodeRunner(pool, codec, LIMITS, interleave=interleave)


def prompts(tokenizer) -> tuple[list[list[int]], list[dict[str, str]]]:
    ids = [[tokenizer.bos_token_id, *tokenizer(p, add_special_tokens=False)["input_ids"]] for p in PROMPTS]
    return ids, [{"prompt": p, "answer": ""} for p in PROMPTS]


def _trainer_and_engine(rank: int, world: int):
    """A t = world trainer with random weights, resharded into the megatron engine at t_g = world."""
    cfg = model_config()
    tokenizer = build_char_tokenizer(ALPHABET, cfg.vocab_size)
    layout = ParallelLayout(tensor=world, pipeline=1, data=1, rollout_tensor=world, rollout_pipeline=1)
    groups = build_train_groups(world, 1, 1)
    trainer = build_policy_trainer(cfg, None, groups)
    full = random_full_state(trainer)
    load_full_state_dict(trainer.model, full, cfg, groups)
    reshard = build_reshard_engine(
        cfg, layout, dict(named_global_params(trainer.model, cfg, groups)), rank=rank,
        groups=make_groups(layout, ENGINE_FAMILIES), bucket_bytes=64 << 20,
    )  # fmt: skip
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    generation_groups = build_generation_groups(layout)
    engine = MegatronRolloutEngine.build(cfg, generation_groups, pad, eos)
    store = GenerationStore.for_engine(reshard)
    store.bind(engine.global_params())
    ReshardHandoff(reshard, store=store).publish(0)
    return cfg, tokenizer, trainer, full, engine, generation_groups


def episodes_on_both_engines(rank: int, world: int) -> dict:
    """The same random weights in the megatron engine at t_g = world (resharded from a t = world
    trainer) and in the HF engine: episodes against Echo, greedy and seeded; the trainer's
    teacher-forced log-probs of the megatron episodes."""
    cfg, tokenizer, trainer, full, engine, _ = _trainer_and_engine(rank, world)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    hf = HFRolloutEngine(build_hf_causal_lm(cfg), pad, eos)
    hf.load_weights(megatron_to_hf_state_dict(full, cfg).items())
    runner = episode_runner(tokenizer)
    prompt_ids, examples = prompts(tokenizer)
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    sampled = SamplingParams(max_new_tokens=4, temperature=1.0)
    seeds = lambda turn: row_seeds(5 + turn, 0, len(PROMPTS))  # noqa: E731
    out = {
        "megatron_greedy": runner.run(engine.generate, prompt_ids, examples, greedy, seeds),
        "hf_greedy": runner.run(hf.generate, prompt_ids, examples, greedy, seeds),
        "megatron_sampled": runner.run(engine.generate, prompt_ids, examples, sampled, seeds),
    }
    runner.pool.close()
    one_batch = episode_runner(tokenizer, interleave=False)
    out["megatron_sampled_one_batch"] = one_batch.run(engine.generate, prompt_ids, examples, sampled, seeds)
    one_batch.pool.close()
    out["trainer_logprobs"] = teacher_forced(trainer, prompt_ids, out["megatron_sampled"], pad)
    return out


def teacher_forced(trainer, prompt_ids, gen, pad: int) -> torch.Tensor:
    """The trainer's log-probs of an episode batch's tokens, attending to the observations as the RL
    job does (hpcrl.rl.experience.Experience.train_batch)."""
    ids_BP, keep_BP = left_pad(prompt_ids, pad)
    context = gen.extras["context_mask_BT"]
    batch = TrainBatch(
        input_ids_BT=torch.cat([ids_BP, gen.response_ids_BT], dim=1),
        attention_mask_BT=torch.cat([keep_BP.bool(), context.bool()], dim=1),
        response_mask_BT=torch.cat([torch.zeros_like(keep_BP), gen.response_mask_BT.long()], dim=1).bool(),
    )
    return trainer.forward(batch, len(prompt_ids)).logprobs_BT[:, ids_BP.shape[1] :] * gen.response_mask_BT


def episodes_of_one_replica(rank: int, world: int, spec: str) -> dict:
    """Episodes at t_g = world against `spec`, built as the RL job builds them (build_episode_runner
    with the replica of the generation groups): what each rank decoded and which ranks ran environment
    workers."""
    _, tokenizer, _, _, engine, generation_groups = _trainer_and_engine(rank, world)
    rollout = RolloutConfig(
        env=spec, max_turns=3, max_new_tokens=4, max_observation_tokens=4, env_timeout_s=30.0, env_workers=2
    )
    runner = build_episode_runner(rollout, tokenizer, generation_replica(generation_groups))
    prompt_ids, examples = prompts(tokenizer)
    seeds = lambda turn: row_seeds(11 + turn, 0, len(PROMPTS))  # noqa: E731
    out = runner.run(engine.generate, prompt_ids, examples, SamplingParams(max_new_tokens=4), seeds)
    pool = getattr(runner.pool, "pool", runner.pool)  # a ReplicaEnvPool's own EnvPool (None: a follower)
    workers = pool.worker_pids() if pool is not None else []
    runner.pool.close()
    return {"out": out, "env_workers": len(workers)}
