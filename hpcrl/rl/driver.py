"""The single-controller RL dataflow (HybridFlow §4): generate -> reward -> ref/old log-probs -> values ->
advantages -> update, as plain code over worker groups.

Placement is the worker groups' business (hpcrl.rl.assemble): colocated, actor, reference, critic and
rollout live on the same ranks; split, actor + rollout on one pool and critic + reference on another.
(The async placement runs the two halves of this step, `collect` and `train_on`, on two pools at once:
hpcrl.rl.async_driver.)
Either way, before generating, the actor's weights go train -> rollout through the reshard engine
(`ActorWorker.sync_weights`), and every rank runs this code on the same global tensors (see
workers.py); rank 0 logs.

One step, for B = prompts_per_step x samples_per_prompt sequences:
  1. reshard actor -> rollout; 2. sample B responses (+ their rollout log-probs); 3. score them (skipped
  samples are dropped; DAPO's overlong penalty added; with dynamic sampling, groups whose scores are all
  equal are dropped and more prompts sampled); 4. old log-probs (actor) and the TIS weights
  min(pi_old / pi_rollout, C), ref log-probs (reference, when kl_coef > 0), values (critic, ppo);
  5. token rewards = outcome on the last token (- kl_coef * KL when kl_in_reward); 6. advantages
  (registry); 7. ppo_epochs actor updates (+ critic updates).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from hpcrl.algorithm.config import AlgorithmConfig
from hpcrl.algorithm.registry import ALGORITHMS
from hpcrl.data.cursor import PromptSampler
from hpcrl.data.tasks import Example
from hpcrl.rewards.scoring import BatchScorer, score_batch
from hpcrl.rl.advantages import (
    AdvantageInputs,
    compute_advantages,
    kl_shaped_rewards,
    outcome_to_token_rewards,
)
from hpcrl.rl.experience import Experience
from hpcrl.rl.losses import kl_penalty, masked_mean, truncated_is_weights
from hpcrl.rl.objectives import policy_loss_fn, value_loss_fn
from hpcrl.rl.shaping import first_groups, informative_groups, overlong_penalty
from hpcrl.rl.workers import ActorWorker, RolloutWorker, TrainerWorker, response_logprobs
from hpcrl.rollout.base import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class Workers:
    actor: ActorWorker
    rollout: RolloutWorker
    reference: TrainerWorker | None = None
    critic: TrainerWorker | None = None


@dataclass
class PromptCodec:
    """Text <-> token ids for prompts and responses (the tokenizer plus the prompt length rule)."""

    encode: Callable[[list[str]], list[list[int]]]
    decode: Callable[[list[int]], str]
    eos_id: int


@dataclass
class PhaseTimer:
    seconds: dict[str, float] = field(default_factory=dict)
    peak_bytes: dict[str, int] = field(default_factory=dict)
    """CUDA only: the most GPU memory allocated during each phase (torch.cuda.max_memory_allocated)."""

    @contextmanager
    def phase(self, name: str):
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            if cuda:
                self.peak_bytes[name] = max(self.peak_bytes.get(name, 0), torch.cuda.max_memory_allocated())


class RLDriver:
    def __init__(
        self,
        algo: AlgorithmConfig,
        sampling: SamplingParams,
        samples_per_prompt: int,
        workers: Workers,
        codec: PromptCodec,
        scorer: BatchScorer,
        nan_policy: str,
        sampler: PromptSampler[Example],
        heldout: list[Example],
        seed: int = 0,
    ):
        self.algo, self.sampling, self.k = algo, sampling, samples_per_prompt
        self.spec = ALGORITHMS[algo.name]
        self.workers, self.codec, self.scorer, self.nan_policy = workers, codec, scorer, nan_policy
        self.sampler, self.heldout, self.seed = sampler, heldout, seed
        self.policy_loss = policy_loss_fn(algo, sampling.max_new_tokens)
        self.value_loss = value_loss_fn(algo, sampling.max_new_tokens)

    # ------------------------------------------------------------------------------------------- pieces
    def _decode(self, ids_BT: torch.Tensor, mask_BT: torch.Tensor) -> list[str]:
        out = []
        for row, mask in zip(ids_BT.tolist(), mask_BT.tolist(), strict=True):
            tokens = [t for t, m in zip(row, mask, strict=True) if m and t != self.codec.eos_id]
            out.append(self.codec.decode(tokens))
        return out

    def _score(self, examples: list[Example], responses: list[str]):
        return score_batch(
            self.scorer,
            [e.prompt for e in examples],
            responses,
            [e.answer for e in examples],
            self.nan_policy,
        )

    def generate_scored(self, examples: list[Example], sampling: SamplingParams, seed: int) -> Experience:
        prompt_ids = self.codec.encode([e.prompt for e in examples])
        gen = self.workers.rollout.generate(prompt_ids, sampling, seed)
        groups = torch.arange(len(examples))
        exp = Experience.from_generation(examples, groups, prompt_ids, gen, self.workers.rollout.pad_id)
        exp.responses = self._decode(gen.response_ids_BT, gen.response_mask_BT)
        return exp

    @torch.no_grad()
    def evaluate(self, step: int) -> float:
        """Mean reward of greedy responses to the held-out prompts (current rollout weights)."""
        exp = self.generate_scored(self.heldout, self.sampling.greedy(), seed=self.seed + 10**6 + step)
        return float(self._score(exp.examples, exp.responses).scores_B.mean())

    # --------------------------------------------------------------------------------------------- step
    def step(self, step: int) -> dict[str, float]:
        timer = PhaseTimer()
        metrics: dict[str, float] = {"step": step}
        with timer.phase("reshard"):
            metrics |= self.workers.actor.sync_weights()
        if self.algo.eval_every and step % self.algo.eval_every == 0:
            with timer.phase("eval"):  # the policy before this step's update, on the weights just synced
                metrics["reward/heldout"] = self.evaluate(step)
        exp, sampled_B = self.collect(step, timer, metrics)
        self.workers.rollout.sleep()  # the generation memory (store / vLLM weights + KV cache) until next sync
        tokens = self.train_on(step, exp, sampled_B, timer, metrics)
        return metrics | self.timing_metrics(timer, *tokens)

    def train_on(
        self, step: int, exp: Experience, sampled_B: torch.Tensor, timer: PhaseTimer, metrics: dict
    ) -> tuple[int, int]:
        """The training half of a step on a collected batch: old/ref log-probs, values, advantages and
        the updates (phase "train"), their metrics added to `metrics` with the batch's reward and length
        figures. Returns (generated tokens, trained tokens) for the throughput figures. The async
        placement's training pool runs it on batches the rollout pool collected (hpcrl.rl.async_driver)."""
        if len(exp) == 0:
            log.warning("step %d: no sample left to train on (skipped rewards / dynamic sampling)", step)
            metrics |= self._scores_metrics(sampled_B)
            return 0, 0
        with timer.phase("train"):
            self._prepare(exp, metrics)
            self._update(exp, metrics)
        metrics |= self._scores_metrics(sampled_B) | self._length_metrics(exp)
        return int(exp.response_mask_BT.sum()), int(exp.train_batch().attention_mask_BT.sum())

    def collect(self, step: int, timer: PhaseTimer, metrics: dict) -> tuple[Experience, torch.Tensor]:
        """This step's training experience, and the scores of every sample drawn for it (for logging).

        Without dynamic sampling: one rollout batch of prompts_per_step prompts. With it (DAPO §3.2):
        rollout batches until prompts_per_step groups with differing rewards are kept, at most
        max_gen_batches; the kept groups are trimmed to prompts_per_step."""
        algo, parts, sampled, kept_groups = self.algo, [], [], 0
        for attempt in range(algo.max_gen_batches if algo.dynamic_sampling else 1):
            exp, skipped = self._rollout_batch(step, attempt, timer)
            metrics["reward/skipped"] = metrics.get("reward/skipped", 0.0) + skipped
            sampled.append(exp.scores_B)
            if algo.dynamic_sampling:
                exp = exp.select(informative_groups(exp.scores_B, exp.group_ids_B))
            parts.append(exp)
            kept_groups += len(exp.group_ids_B.unique())
            if kept_groups >= algo.prompts_per_step:
                break
        exp = Experience.concat(parts, self.workers.rollout.pad_id)
        if algo.dynamic_sampling:
            exp = exp.select(first_groups(exp.group_ids_B, algo.prompts_per_step))
            metrics["sampling/gen_batches"] = float(len(parts))
            metrics["sampling/kept_groups"] = float(min(kept_groups, algo.prompts_per_step))
        return exp, torch.cat(sampled)

    def _rollout_batch(self, step: int, attempt: int, timer: PhaseTimer) -> tuple[Experience, int]:
        """Sample and score one batch of prompts_per_step prompts x k samples (rows whose reward was
        skipped are dropped). Group ids are unique across a step's batches."""
        prompts = self.sampler.next_batch(self.algo.prompts_per_step)
        examples = [e for e in prompts for _ in range(self.k)]
        # attempt 0 keeps the seed of a step without dynamic sampling; later batches draw fresh rows
        seed = self.seed * 100_003 + step + attempt * 1_000_000_007
        with timer.phase("generate"):
            exp = self.generate_scored(examples, self.sampling, seed=seed)
            exp.group_ids_B = (attempt * len(prompts) + torch.arange(len(prompts))).repeat_interleave(self.k)
            baseline_B = self._greedy_baseline(prompts, step) if self.spec.greedy_baseline else None
        with timer.phase("reward"):
            result = self._score(exp.examples, exp.responses)
            exp.scores_B = result.scores_B + self._length_penalty(exp)
            if baseline_B is not None:
                exp.tensors["baseline_B"] = baseline_B.repeat_interleave(self.k)
            exp = exp.select(result.keep_B) if result.num_skipped else exp
        return exp, result.num_skipped

    def final_evaluation(self, step: int) -> dict[str, float]:
        """Held-out reward of the final policy (after the last update), logged as step `steps`."""
        self.workers.actor.sync_weights()
        heldout = self.evaluate(step)
        self.workers.rollout.sleep()
        return {"step": step, "reward/heldout": heldout}

    def _greedy_baseline(self, prompts: list[Example], step: int) -> torch.Tensor:
        exp = self.generate_scored(prompts, self.sampling.greedy(), seed=step)
        return self._score(exp.examples, exp.responses).scores_B + self._length_penalty(exp)

    def _length_penalty(self, exp: Experience) -> torch.Tensor:
        a = self.algo
        return overlong_penalty(
            exp.gen.lengths_B, self.sampling.max_new_tokens, a.overlong_buffer_len, a.overlong_penalty_factor
        )

    def _prepare(self, exp: Experience, metrics: dict) -> None:
        """Old/ref log-probs, values, token rewards and advantages (all global, response space).

        The three forwards start before any result is taken, so split pools run them concurrently."""
        mask = exp.response_mask_BT
        batch = exp.train_batch()
        w = self.workers
        pending_old = w.actor.start_forward(batch)
        pending_ref = w.reference.start_forward(batch) if w.reference is not None else None
        pending_values = w.critic.start_forward(batch) if w.critic is not None else None
        old_logp, _ = response_logprobs(exp, pending_old.result())
        delta = (old_logp - exp.gen.logprobs_BT).abs()[mask.bool()]
        metrics["mismatch/logprob_max"] = float(delta.max()) if delta.numel() else 0.0
        metrics["mismatch/logprob_mean"] = float(delta.mean()) if delta.numel() else 0.0
        exp.tensors["old_logprobs"] = old_logp
        if self.algo.tis_cap is not None:
            weights, tis = truncated_is_weights(old_logp, exp.gen.logprobs_BT, mask, self.algo.tis_cap)
            exp.tensors["tis_weights"] = weights
            metrics["tis/weight_mean"], metrics["tis/clip_frac"] = tis.weight_mean, tis.clip_fraction
        scores = exp.scores_B
        token_rewards = outcome_to_token_rewards(scores, mask)
        if pending_ref is not None:
            ref_logp, _ = response_logprobs(exp, pending_ref.result())
            exp.tensors["ref_logprobs"] = ref_logp
            kl_BT = kl_penalty(old_logp, ref_logp, self.algo.kl_estimator) * mask
            metrics["kl/ref"] = float(masked_mean(kl_BT, mask))
            if self.algo.kl_in_reward:  # every estimator sees score - beta * sum_t KL_t
                scores, token_rewards = kl_shaped_rewards(scores, mask, kl_BT, self.algo.kl_coef)
                metrics["reward/kl_shaped_mean"] = float(scores.mean())
        values = None
        if pending_values is not None:
            values = exp.to_response(pending_values.result().values_BT) * mask
            exp.tensors["old_values"] = values
        out = compute_advantages(
            self.algo.name,
            AdvantageInputs(
                scores_B=scores,
                token_rewards_BT=token_rewards,
                mask_BT=mask,
                group_ids_B=exp.group_ids_B,
                values_BT=values,
                baseline_scores_B=exp.tensors.get("baseline_B"),
                gamma=self.algo.gamma,
                lam=self.algo.lam,
                norm_adv_by_std=self.algo.norm_adv_by_std,
            ),
        )
        exp.tensors["advantages"] = out.advantages_BT
        exp.tensors["returns"] = out.returns_BT
        metrics["advantage/mean_abs"] = float(masked_mean(out.advantages_BT.abs(), mask))

    def _update(self, exp: Experience, metrics: dict) -> None:
        actor_keys = ["old_logprobs", "advantages"] + [
            k for k in ("ref_logprobs", "tis_weights") if k in exp.tensors
        ]
        actor_batch = exp.train_batch({k: exp.tensors[k] for k in actor_keys})
        critic_batch = (
            exp.train_batch({k: exp.tensors[k] for k in ("old_values", "returns")})
            if self.workers.critic is not None
            else None
        )
        for _ in range(self.algo.ppo_epochs):  # both updates start first: split pools run them concurrently
            pending_actor = self.workers.actor.start_update(actor_batch, self.policy_loss)
            pending_critic = None
            if critic_batch is not None:
                pending_critic = self.workers.critic.start_update(critic_batch, self.value_loss)
            stats = pending_actor.result()
            if pending_critic is not None:
                cstats = pending_critic.result()
        metrics.update({k if "/" in k else f"actor/{k}": v for k, v in stats.items()})
        if critic_batch is not None:
            metrics.update(
                {
                    ("critic/value_loss" if k == "loss" else k if "/" in k else f"critic/{k}"): v
                    for k, v in cstats.items()
                }
            )

    @staticmethod
    def _scores_metrics(scores_B: torch.Tensor) -> dict[str, float]:
        """Reward of every sample drawn this step (before dynamic sampling dropped any group)."""
        if len(scores_B) == 0:
            return {}
        return {
            "reward/mean": float(scores_B.mean()),
            "reward/std": float(scores_B.std()) if len(scores_B) > 1 else 0.0,
        }

    @staticmethod
    def _length_metrics(exp: Experience) -> dict[str, float]:
        lengths = exp.response_mask_BT.sum(dim=1)
        return {"response/length_mean": float(lengths.mean()), "response/length_max": float(lengths.max())}

    @staticmethod
    def timing_metrics(timer: PhaseTimer, gen_tokens: int, train_tokens: int) -> dict[str, float]:
        """Seconds and share of each phase, tokens/s of generation and training, CUDA memory peaks;
        time/step_s is the sum of the phases."""
        total = sum(timer.seconds.values()) or 1e-9
        out = {f"time/{k}_s": v for k, v in timer.seconds.items()}
        out |= {f"share/{k}": v / total for k, v in timer.seconds.items()}
        if timer.seconds.get("generate"):
            out["tps/generate"] = gen_tokens / timer.seconds["generate"]
        if timer.seconds.get("train"):
            out["tps/train"] = train_tokens / timer.seconds["train"]
        out["time/step_s"] = total
        out |= {f"memory/{k}_peak_gib": v / 2**30 for k, v in timer.peak_bytes.items()}
        return out
