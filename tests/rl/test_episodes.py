"""Multi-turn episodes (hpcrl.rl.episodes): the same episodes on every engine, the trainer's log-probs of
the model's own tokens, observation tokens outside every loss term, rewards where they were earned."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from hpcrl.algorithm.config import AlgorithmConfig
from hpcrl.distributed.spawn import run_ranks
from hpcrl.rl.objectives import policy_loss_fn
from hpcrl.train.batch import TrainBatch
from hpcrl.train.logprobs import HeadOutputs
from tests.rl._episode_ranks import LIMITS, episodes_of_one_replica, episodes_on_both_engines

pytestmark = pytest.mark.dist
RANK_BOUND = f"{Path(__file__).resolve().parents[1] / 'env' / '_envs.py'}:RankBound"
LOGPROB_TOL = 1e-5


@pytest.fixture(scope="module")
def episodes():
    return run_ranks(episodes_on_both_engines, 2, timeout_s=300)[0]


def test_episodes_alternate_the_models_turns_and_the_environments_observations(episodes):
    gen = episodes["megatron_sampled"]
    policy, context = gen.response_mask_BT, gen.extras["context_mask_BT"]
    turns, rewards = gen.extras["turns_BT"], gen.extras["env_rewards_BT"]
    assert gen.response_ids_BT.shape[1] == LIMITS.width
    observation = (context == 1) & (policy == 0)
    assert observation.any(), "Echo answers every turn but the last"
    assert torch.equal(turns > 0, policy == 1)  # turn numbers on the model's tokens only
    for b in range(len(turns)):
        taken = int(turns[b].max())
        assert taken == 3  # Echo ends after 3 turns (each turn ends at EOS or 4 tokens)
        for turn in range(1, taken + 1):
            last = int((turns[b] == turn).nonzero().max())
            assert rewards[b, last] == 0.25  # each turn's reward on its last token
        assert float(rewards[b].sum()) == 0.75
        echoed = gen.response_ids_BT[b][observation[b]].tolist()
        assert len(echoed) == 2 * (taken - 1)  # "=<turn><digit>" cut to max_observation_tokens = 2


def test_every_engine_runs_the_same_greedy_episodes(episodes):
    hf, megatron = episodes["hf_greedy"], episodes["megatron_greedy"]
    assert torch.equal(hf.response_ids_BT, megatron.response_ids_BT)
    assert torch.equal(hf.response_mask_BT, megatron.response_mask_BT)
    assert torch.equal(hf.extras["context_mask_BT"], megatron.extras["context_mask_BT"])
    torch.testing.assert_close(hf.logprobs_BT, megatron.logprobs_BT, atol=LOGPROB_TOL, rtol=0)


def test_interleaved_halves_sample_the_episodes_one_batch_does(episodes):
    """Per-(row, turn) seeds: decoding the batch in two interleaved halves (so environments step while
    the other half decodes) changes no token of any episode."""
    a, b = episodes["megatron_sampled"], episodes["megatron_sampled_one_batch"]
    assert torch.equal(a.response_ids_BT, b.response_ids_BT)
    assert torch.equal(a.extras["env_rewards_BT"], b.extras["env_rewards_BT"])
    torch.testing.assert_close(a.logprobs_BT, b.logprobs_BT, atol=LOGPROB_TOL, rtol=0)


def test_the_trainers_teacher_forced_log_probs_of_the_models_tokens_match_the_engines(episodes):
    gen = episodes["megatron_sampled"]
    gap = (episodes["trainer_logprobs"] - gen.logprobs_BT).abs().max()
    assert gap <= LOGPROB_TOL, gap


def test_observation_tokens_have_no_gradient_in_any_policy_loss_term(episodes):
    """The loss's gradient at an observation token is 0, and what lies there (old and reference
    log-probs, advantages, importance weights) changes neither the loss nor any gradient."""
    gen = episodes["megatron_sampled"]
    policy = gen.response_mask_BT
    observation = (gen.extras["context_mask_BT"] == 1) & (policy == 0)
    algo = AlgorithmConfig(name="grpo", entropy_coef=0.1, kl_coef=0.2, kl_in_reward=False, tis_cap=2.0)
    loss_fn = policy_loss_fn(algo, LIMITS.width)
    gen_rng = torch.Generator().manual_seed(0)
    base = {
        k: torch.randn(policy.shape, generator=gen_rng)
        for k in ("old_logprobs", "advantages", "ref_logprobs")
    }
    base["tis_weights"] = torch.rand(policy.shape, generator=gen_rng) + 0.5

    def loss_and_grads(extras):
        logp = torch.randn(policy.shape, generator=torch.Generator().manual_seed(1)).requires_grad_()
        entropy = torch.rand(policy.shape, generator=torch.Generator().manual_seed(2)).requires_grad_()
        mb = TrainBatch(
            input_ids_BT=gen.response_ids_BT,
            attention_mask_BT=gen.extras["context_mask_BT"].bool(),
            response_mask_BT=policy.bool(),
            extras=extras,
            num_global_seqs=len(policy),
            num_global_response_tokens=int(policy.sum()),
        )
        loss, _ = loss_fn(HeadOutputs(logprobs_BT=logp, entropy_BT=entropy), mb)
        loss.backward()
        return loss.detach(), logp.grad, entropy.grad

    loss, grad_logp, grad_entropy = loss_and_grads(base)
    assert grad_logp[policy == 1].abs().sum() > 0 and grad_entropy[policy == 1].abs().sum() > 0
    assert torch.all(grad_logp[observation] == 0) and torch.all(grad_entropy[observation] == 0)
    noise = {k: torch.where(observation, v + 100.0, v) for k, v in base.items()}
    loss2, grad_logp2, grad_entropy2 = loss_and_grads(noise)
    assert (
        torch.equal(loss, loss2)
        and torch.equal(grad_logp, grad_logp2)
        and torch.equal(grad_entropy, grad_entropy2)
    )


def test_a_replica_steps_its_environments_on_its_first_rank_only_and_every_rank_decodes_the_same():
    """At t_g = 2 the two ranks of the replica decode in lockstep; a copy of RankBound on each would
    disagree (its observation names its rank; on rank 1 it never returns, so rank 1 alone would end
    every episode at its timeout and rank 0's next turn would wait on a TP peer that never comes). The
    leader steps the environments and broadcasts; rank 1 starts no environment worker."""
    first, second = run_ranks(episodes_of_one_replica, 2, RANK_BOUND, timeout_s=300)
    a, b = first["out"], second["out"]
    for name in ("response_ids_BT", "response_mask_BT", "logprobs_BT"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for name in ("context_mask_BT", "env_rewards_BT", "turns_BT"):
        assert torch.equal(a.extras[name], b.extras[name]), name
    assert a.extras["env_errors"] == b.extras["env_errors"] == [""] * 4
    assert (first["env_workers"], second["env_workers"]) == (2, 0)  # rollout.env_workers=2
    observed = a.response_ids_BT[(a.extras["context_mask_BT"] == 1) & (a.response_mask_BT == 0)]
    assert observed.numel() > 0 and int(a.extras["turns_BT"].amax()) == 3
    assert float(a.extras["env_rewards_BT"].sum()) == 4 * 3 * 0.5  # 0.5 per turn, 3 turns, 4 episodes


CHAT_TOOL = f"{Path(__file__).resolve().parents[1] / 'env' / '_envs.py'}:ChatTool"


@pytest.mark.parametrize("nudge", [False, True])
def test_chat_message_observations_are_the_templates_continuation(nudge):
    """An environment answering with chat messages: each observation's tokens are the chat template's
    rendering of them after the model's turn, through the generation prompt (hpcrl.data.chat)."""
    from hpcrl.data.chat import Message, continuation_ids
    from hpcrl.data.tasks import ALPHABET
    from hpcrl.data.tokenizer import CHAT_VOCAB_SIZE, build_char_tokenizer
    from hpcrl.rl.episodes import build_episode_runner
    from hpcrl.rollout.base import SamplingParams, row_seeds
    from hpcrl.rollout.config import RolloutConfig
    from hpcrl.rollout.hf_engine import HFRolloutEngine, build_hf_causal_lm
    from tests.rollout._megatron_rank_fns import model_config

    tokenizer = build_char_tokenizer(ALPHABET, CHAT_VOCAB_SIZE + 4)
    cfg = dataclasses.replace(model_config(), vocab_size=CHAT_VOCAB_SIZE + 4, max_position_embeddings=64)
    engine = HFRolloutEngine(build_hf_causal_lm(cfg), tokenizer.pad_token_id, tokenizer.eos_token_id)
    rollout = RolloutConfig(
        env=CHAT_TOOL, env_args={"nudge": nudge}, max_turns=2, max_new_tokens=3, max_observation_tokens=16
    )
    runner = build_episode_runner(rollout, tokenizer)
    prompts = [
        [tokenizer.bos_token_id, *tokenizer(p, add_special_tokens=False)["input_ids"]] for p in ["1=", "2="]
    ]
    try:
        out = runner.run(engine.generate, prompts, [{"prompt": "1=", "answer": ""}] * 2,
                         SamplingParams(max_new_tokens=3), lambda turn: row_seeds(turn, 0, 2))  # fmt: skip
    finally:
        runner.pool.close()
    nudged = [Message("user", "0")] if nudge else []
    expected = continuation_ids(tokenizer, [Message("tool", "=1"), *nudged])
    observed = (out.extras["context_mask_BT"] == 1) & (out.response_mask_BT == 0)
    for b in range(2):
        assert out.response_ids_BT[b][observed[b]].tolist() == expected
        assert out.extras["env_errors"][b] == "" and float(out.extras["env_rewards_BT"][b].sum()) == 2.0
    assert tokenizer.decode(expected).startswith("<|tool|>=1")  # the tiny template: <|tool|>=1<eos>...
    assert tokenizer.decode(expected).endswith("<|assistant|>")


def test_chat_messages_for_a_tokenizer_without_a_chat_template_stop_the_run():
    from hpcrl.data.chat import Message
    from hpcrl.data.tasks import ALPHABET
    from hpcrl.data.tokenizer import build_char_tokenizer
    from hpcrl.rl.episodes import EnvironmentFailed, observation_ids

    plain = build_char_tokenizer(ALPHABET, 16)  # too few ids for the role tokens: no chat template
    assert observation_ids(plain, "=12") == plain("=12", add_special_tokens=False)["input_ids"]
    with pytest.raises(
        EnvironmentFailed, match="chat messages, which cannot be rendered: .*tokenizer has none"
    ):
        observation_ids(plain, (Message("tool", "=12"),))
