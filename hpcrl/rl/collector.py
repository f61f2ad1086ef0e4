"""The collecting half of an RL step: draw prompts, generate, score, and hand over a `RolloutBatch`.

One batch, for B = prompts_per_step x samples_per_prompt sequences: sample B responses (+ their rollout
log-probs) with the rollout worker; score them (skipped samples are dropped; DAPO's overlong penalty
added; ReMax's greedy baseline scored alongside); with dynamic sampling (DAPO §3.2), groups whose scores
are all equal are dropped and more prompts sampled, at most `max_gen_batches` rollout batches, and the
kept groups are trimmed to prompts_per_step. The colocated step (hpcrl.rl.driver) and the async
placement's rollout pool (hpcrl.rl.offpolicy.driver) both collect through it; environments plug in here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hpcrl.algorithm.config import AlgorithmConfig
from hpcrl.algorithm.registry import ALGORITHMS
from hpcrl.data.cursor import PromptSampler
from hpcrl.data.tasks import Example
from hpcrl.rewards.scoring import BatchScorer, score_batch
from hpcrl.rewards.terms import TERM_METRIC
from hpcrl.rl.episodes import EpisodeOutcome, episode_outcome, last_turn_mask
from hpcrl.rl.experience import Experience
from hpcrl.rl.shaping import first_groups, informative_groups, overlong_penalty
from hpcrl.rl.timing import PhaseTimer
from hpcrl.rl.workers import RolloutWorker
from hpcrl.rollout.base import SamplingParams

HELDOUT = "reward/heldout"
"""The training reward's mean over greedy held-out responses."""
HELDOUT_TASK = "reward/heldout_task"
"""The built-in task rule's mean over the same responses, when the training reward is another."""


@dataclass
class PromptCodec:
    """Text <-> token ids for prompts and responses (the tokenizer plus the prompt length rule)."""

    encode: Callable[[list[str]], list[list[int]]]
    decode: Callable[[list[int]], str]
    eos_id: int


@dataclass
class RolloutBatch:
    """One training batch as it was collected."""

    index: int
    """The training step that will train on it (batch j is trained at step j)."""
    version: int
    """Weight version it was generated with: the weights after `version` updates (on the async
    placement every sample's `exp.tensors[VERSION_KEY]` holds it too)."""
    exp: Experience
    """Scored experience after dynamic sampling (rows whose reward was skipped are dropped)."""
    sampled_B: torch.Tensor
    """Scores of every sample drawn for it, before dynamic sampling dropped groups (reward/mean)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Its collection's metrics: reward/skipped, sampling/* (deterministic: saved with the batch)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall-clock seconds of its collection's phases (generate, reward). Not saved: a checkpoint holds
    only what the run computes, so a resumed run's checkpoints are bitwise the uninterrupted run's."""


@dataclass
class CollectorSettings:
    """What a Collector samples with: the algorithm's sampling knobs and the run's seed."""

    algo: AlgorithmConfig
    sampling: SamplingParams
    samples_per_prompt: int
    nan_policy: str
    seed: int = 0
    env: str | None = None
    """The multi-turn environment (rollout.env): each sample is an episode against it."""


class Collector:
    """Prompts from `sampler`, responses from `rollout`, scores from `scorer`: RolloutBatches."""

    def __init__(
        self,
        settings: CollectorSettings,
        rollout: RolloutWorker,
        codec: PromptCodec,
        scorer: BatchScorer,
        sampler: PromptSampler[Example],
        heldout: list[Example],
        task_scorer: BatchScorer | None = None,
    ):
        """`task_scorer`: the built-in task's own rule, to score the held-out responses by it too when
        the training reward is something else (a reward model, a mix, a function)."""
        self.settings, self.algo, self.sampling = settings, settings.algo, settings.sampling
        self.k, self.seed = settings.samples_per_prompt, settings.seed
        self.greedy_baseline = ALGORITHMS[settings.algo.name].greedy_baseline
        self.rollout, self.codec, self.scorer, self.nan_policy = rollout, codec, scorer, settings.nan_policy
        self.sampler, self.heldout, self.task_scorer = sampler, heldout, task_scorer

    def collect(self, index: int, version: int, timer: PhaseTimer) -> RolloutBatch:
        """Batch `index`, generated with weight version `version`; its phases are timed on `timer`.

        Without dynamic sampling: one rollout batch of prompts_per_step prompts. With it (DAPO §3.2):
        rollout batches until prompts_per_step groups with differing rewards are kept, at most
        max_gen_batches; the kept groups are trimmed to prompts_per_step."""
        algo, parts, sampled, kept_groups = self.algo, [], [], 0
        metrics: dict[str, float] = {}
        for attempt in range(algo.max_gen_batches if algo.dynamic_sampling else 1):
            exp, skipped, reward_metrics = self._rollout_batch(index, attempt, timer)
            metrics["reward/skipped"] = metrics.get("reward/skipped", 0.0) + skipped
            metrics |= reward_metrics  # the last batch's
            sampled.append(exp.scores_B)
            if algo.dynamic_sampling:
                exp = exp.select(informative_groups(exp.scores_B, exp.group_ids_B))
            parts.append(exp)
            kept_groups += len(exp.group_ids_B.unique())
            if kept_groups >= algo.prompts_per_step:
                break
        exp = Experience.concat(parts, self.rollout.pad_id)
        if algo.dynamic_sampling:
            exp = exp.select(first_groups(exp.group_ids_B, algo.prompts_per_step))
            metrics["sampling/gen_batches"] = float(len(parts))
            metrics["sampling/kept_groups"] = float(min(kept_groups, algo.prompts_per_step))
        return RolloutBatch(index, version, exp, torch.cat(sampled), metrics, dict(timer.seconds))

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy responses to the held-out prompts (current rollout weights), scored: `reward/heldout`,
        the training reward's mean (an episode's: its environment's rewards too, and the means of the
        numbers its environment reported as `reward/heldout_env/<key>`, e.g. the Calculator's success); for a mix, each term's mean as `reward/heldout_term/<source>` (a
        reward model's own held-out score, even at weight 0); with a task scorer, `reward/heldout_task`,
        the task rule's mean (what a reward model, another rule or a function stands in for, on responses
        no reward trained on)."""
        exp = self.generate_scored(self.heldout, self.sampling.greedy(), seed=self.seed + 10**6 + step)
        if self.rollout.episodes is not None:
            self.rollout.episodes.take_wait_s()  # the eval phase's, not the next step's generate
        result = self._score(exp.examples, exp.responses)
        scores_B, outcome = result.scores_B, self._outcome(exp)
        if outcome is not None:
            keep_B = outcome.keep_B & result.keep_B
            scores_B = (scores_B + outcome.returns_B)[keep_B]
        out = {HELDOUT: float(scores_B.mean())}
        if outcome is not None:  # the environments' own numbers on held-out episodes (env/success, ...)
            out |= {
                f"{HELDOUT}_{key}": value
                for key, value in outcome.metrics.items()
                if key not in ("env/failed", "env/observation_cut")
            }
        out |= {
            f"{HELDOUT}_term/{key.removeprefix(TERM_METRIC)}": value
            for key, value in result.metrics.items()
            if key.startswith(TERM_METRIC)
        }
        if self.task_scorer is not None:
            prompts, answers = [e.prompt for e in exp.examples], [e.answer for e in exp.examples]
            task = score_batch(self.task_scorer, prompts, exp.responses, answers, "error")
            out[HELDOUT_TASK] = float(task.scores_B.mean())
        return out

    def generate_scored(self, examples: list[Example], sampling: SamplingParams, seed: int) -> Experience:
        """Responses to `examples` (decoded into `exp.responses`), not yet scored. With an environment,
        episodes: their tensors go to `exp.tensors` (context_mask_BT, env_rewards_BT, turns_BT), their
        errors and infos to `exp.episodes` until scoring, and `exp.responses` hold their last turns."""
        prompt_ids = self.codec.encode([e.prompt for e in examples])
        resets = [{"prompt": e.prompt, "answer": e.answer} for e in examples] if self.settings.env else None
        gen = self.rollout.generate(prompt_ids, sampling, seed, resets)
        extras, gen.extras = gen.extras, {}
        groups = torch.arange(len(examples))
        exp = Experience.from_generation(examples, groups, prompt_ids, gen, self.rollout.pad_id)
        exp.tensors |= {k: v for k, v in extras.items() if isinstance(v, torch.Tensor)}
        exp.episodes = {k: v for k, v in extras.items() if not isinstance(v, torch.Tensor)}
        answer_BT = last_turn_mask(extras["turns_BT"]) if extras else gen.response_mask_BT
        exp.responses = self._decode(gen.response_ids_BT, answer_BT)
        return exp

    def _rollout_batch(
        self, step: int, attempt: int, timer: PhaseTimer
    ) -> tuple[Experience, int, dict[str, float]]:
        """Sample and score one batch of prompts_per_step prompts x k samples (rows whose reward was
        skipped are dropped). Group ids are unique across a step's batches. Returns the experience, the
        skipped count and the reward function's extra numbers."""
        prompts = self.sampler.next_batch(self.algo.prompts_per_step)
        examples = [e for e in prompts for _ in range(self.k)]
        # attempt 0 keeps the seed of a step without dynamic sampling; later batches draw fresh rows
        seed = self.seed * 100_003 + step + attempt * 1_000_000_007
        with timer.phase("generate"):
            exp = self.generate_scored(examples, self.sampling, seed=seed)
            if self.rollout.episodes is not None:
                wait = self.rollout.episodes.take_wait_s()
                timer.within["env_wait"] = timer.within.get("env_wait", 0.0) + wait
            exp.group_ids_B = (attempt * len(prompts) + torch.arange(len(prompts))).repeat_interleave(self.k)
            baseline_B = self._greedy_baseline(prompts, step) if self.greedy_baseline else None
        with timer.phase("reward"):
            result = self._score(exp.examples, exp.responses)
            exp.scores_B = result.scores_B + self._length_penalty(exp)
            keep_B, metrics = result.keep_B, dict(result.metrics)
            if (outcome := self._outcome(exp)) is not None:
                exp.scores_B = exp.scores_B + outcome.returns_B
                keep_B, metrics = keep_B & outcome.keep_B, metrics | outcome.metrics
            if baseline_B is not None:
                exp.tensors["baseline_B"] = baseline_B.repeat_interleave(self.k)
            skipped = int((~keep_B).sum())
            exp = exp.select(keep_B) if skipped else exp
        return exp, skipped, metrics

    def _greedy_baseline(self, prompts: list[Example], step: int) -> torch.Tensor:
        exp = self.generate_scored(prompts, self.sampling.greedy(), seed=step)
        scores_B = self._score(exp.examples, exp.responses).scores_B + self._length_penalty(exp)
        outcome = self._outcome(exp)
        return scores_B if outcome is None else scores_B + outcome.returns_B * outcome.keep_B

    def _outcome(self, exp: Experience) -> EpisodeOutcome | None:
        """The environment's returns, failures and metrics of episodes (None for single responses)."""
        if not exp.episodes:
            return None
        extras = exp.episodes | {
            "turns_BT": exp.tensors["turns_BT"],
            "env_rewards_BT": exp.tensors["env_rewards_BT"],
        }
        exp.episodes = {}
        return episode_outcome(extras, self.settings.env, self.nan_policy)

    def _length_penalty(self, exp: Experience) -> torch.Tensor:
        a = self.algo
        return overlong_penalty(
            exp.gen.lengths_B, self.sampling.max_new_tokens, a.overlong_buffer_len, a.overlong_penalty_factor
        )

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
