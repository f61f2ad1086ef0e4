"""Multi-turn episodes over any rollout engine: the model's turn, the environment's observation, the next
turn, ... (`rollout.env`, hpcrl.env), as one row of response-space tensors.

An episode's tokens after its prompt are [reset observation] turn 1 [observation 1] turn 2 ... in one
row of width `rollout.response_tokens()`. `response_mask_BT` is 1 on the model's own tokens only - the
loss, the log-prob ratio, the KL and the entropy read it - and `extras["context_mask_BT"]` on every token
the model reads (its turns and the observations), what the trainer attends to. A turn is one `generate`
call of the engine on the whole context so far, so every engine (HF, megatron at any generation layout,
vLLM) runs episodes the same way and its log-probs are the trainer's teacher-forced ones of the same
context. Each turn's reward lands on the turn's last token (`extras["env_rewards_BT"]`).

Episodes are batched: each turn generates for every episode still running (those that ended - done,
out of turns or out of tokens - leave), then every one of them steps its environment at once in the
EnvPool's workers. Sampling seeds are per (row, turn), so an engine that honours seeds samples the same
episode whatever the replica split.

Shape legend: B = episodes, T = response_tokens (the episode width).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hpcrl.data.chat import continuation_ids
from hpcrl.env.pool import EnvFailure, EnvPool, EnvRequest
from hpcrl.env.replica import ReplicaEnvPool, ReplicaGroup
from hpcrl.env.result import Observation
from hpcrl.errors import ConfigError
from hpcrl.rollout.base import GenerationOutput, SamplingParams
from hpcrl.rollout.config import RolloutConfig

Generate = Callable[[Sequence[Sequence[int]], SamplingParams, "list[int] | None"], GenerationOutput]
"""An engine's generate (prompts, sampling, one seed per prompt or None)."""


@dataclass(frozen=True)
class EpisodeCodec:
    """Text <-> tokens on the episode's side: observations in (no BOS), turns out (without EOS)."""

    encode_observation: Callable[[Observation], list[int]]
    decode: Callable[[list[int]], str]
    eos_id: int
    pad_id: int


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_observation_tokens: int
    width: int
    """Tokens after the prompt (rollout.response_tokens())."""


@dataclass
class _Episode:
    """One episode's row as it grows."""

    example: dict[str, str]
    context: list[int]
    tokens: list[int] = field(default_factory=list)
    policy: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    info: dict[str, float] = field(default_factory=dict)
    error: str = ""
    done: bool = False
    observation_cut: int = 0

    def append(self, ids: Sequence[int], logprobs: Sequence[float] | None, turn: int) -> None:
        self.tokens += ids
        self.context += ids
        self.policy += [1.0 if logprobs is not None else 0.0] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.rewards += [0.0] * len(ids)
        self.turns += [turn if logprobs is not None else 0] * len(ids)


class EpisodeRunner:
    """Runs batches of episodes against `pool` with an engine's generate.

    With `interleave` (rollout.env_interleave), a batch's episodes are decoded in two halves that take
    turns: while one half's environments step (in the pool's workers), the other half decodes its next
    turn, so an environment's latency hides behind decoding instead of adding to it. Each episode's
    tokens are the same either way for an engine that honours per-row seeds (the HF engine samples
    from the process RNG, so its samples depend on the split)."""

    def __init__(
        self,
        pool: EnvPool | ReplicaEnvPool,
        codec: EpisodeCodec,
        limits: EpisodeLimits,
        interleave: bool = True,
    ):
        self.pool, self.codec, self.limits, self.interleave = pool, codec, limits, interleave
        self._next_id = 0
        """Episode ids are unique over the pool's life (its workers key environments by them)."""
        self.wait_s = 0.0
        """Seconds spent blocked on environments (not decoding) since the last `take_wait_s`."""

    def take_wait_s(self) -> float:
        """Seconds blocked on environments since the last call (the step's env wait, time/env_wait_s)."""
        wait, self.wait_s = self.wait_s, 0.0
        return wait

    def run(
        self,
        generate: Generate,
        prompt_ids: Sequence[Sequence[int]],
        examples: Sequence[dict[str, str]],
        sampling: SamplingParams,
        turn_seeds: Callable[[int], list[int] | None],
    ) -> GenerationOutput:
        """One episode per prompt. `turn_seeds(turn)`: the rows' seeds for that turn (None: the engine's
        process RNG)."""
        first, self._next_id = self._next_id, self._next_id + len(prompt_ids)
        episodes = [_Episode(dict(ex), list(ids)) for ex, ids in zip(examples, prompt_ids, strict=True)]
        every = list(range(len(episodes)))
        self._apply(episodes, self._submit(episodes, every, first), 0)
        halves = [every[0::2], every[1::2]] if self.interleave and len(every) > 1 else [every]
        pending: dict[int, tuple] = {}
        for turn in range(1, self.limits.max_turns + 1):
            for h, members in enumerate(halves):
                if h in pending:  # this half's environments stepped while the other half decoded
                    self._apply(episodes, *pending.pop(h))
                running = [i for i in members if not episodes[i].done and self._room(episodes[i]) > 0]
                if running:
                    self._generate_turn(episodes, running, generate, sampling, turn_seeds(turn), turn)
                    pending[h] = (self._submit(episodes, running, first), turn)
        for submitted, turn in pending.values():
            self._apply(episodes, submitted, turn)
        self.pool.forget(range(first, first + len(episodes)))
        return self._output(episodes)

    def _room(self, episode: _Episode) -> int:
        return self.limits.width - len(episode.tokens)

    def _generate_turn(self, episodes, running, generate, sampling, seeds, turn) -> None:
        room = max(self._room(episodes[i]) for i in running)  # never decode past the episode's width
        out = generate(
            [episodes[i].context for i in running],
            dataclasses.replace(sampling, max_new_tokens=min(sampling.max_new_tokens, room)),
            None if seeds is None else [seeds[i] for i in running],
        )
        for row, i in enumerate(running):
            e = episodes[i]
            n = min(int(out.response_mask_BT[row].sum()), self._room(e))
            ids = out.response_ids_BT[row, :n].tolist()
            e.append(ids, out.logprobs_BT[row, :n].tolist(), turn)
            e.actions.append(self.codec.decode([t for t in ids if t != self.codec.eos_id]))

    def _submit(self, episodes: list[_Episode], indices: list[int], first: int) -> tuple[list[int], Future]:
        """Start the reset (no actions yet) or the step of each episode of `indices`."""
        requests = [EnvRequest(first + i, episodes[i].example, list(episodes[i].actions)) for i in indices]
        return indices, self.pool.submit(requests)

    def _apply(self, episodes: list[_Episode], submitted: tuple[list[int], Future], turn: int) -> None:
        """Wait for the environments' results (counted as wait) and append what they observe."""
        indices, future = submitted
        start = time.perf_counter()
        results = future.result()
        self.wait_s += time.perf_counter() - start
        for i, result in zip(indices, results, strict=True):
            e = episodes[i]
            if isinstance(result, EnvFailure):
                e.error, e.done = result.message, True
                continue
            if turn > 0:
                e.rewards[-1] += result.reward
                e.info = result.info
            e.done = result.done or turn == self.limits.max_turns
            if not e.done and result.observation:
                ids = self.codec.encode_observation(result.observation)
                keep = min(len(ids), self.limits.max_observation_tokens, self._room(e))
                e.observation_cut += len(ids) - keep
                e.append(ids[:keep], None, 0)

    def _output(self, episodes: list[_Episode]) -> GenerationOutput:
        B, T = len(episodes), self.limits.width

        def row_tensor(values: Callable[[_Episode], list], dtype, fill=0) -> torch.Tensor:
            out = torch.full((B, T), fill, dtype=dtype)
            for b, e in enumerate(episodes):
                row = values(e)
                out[b, : len(row)] = torch.tensor(row, dtype=dtype)
            return out

        return GenerationOutput(
            response_ids_BT=row_tensor(lambda e: e.tokens, torch.long, self.codec.pad_id),
            response_mask_BT=row_tensor(lambda e: e.policy, torch.float32),
            logprobs_BT=row_tensor(lambda e: e.logprobs, torch.float32),
            extras={
                "context_mask_BT": row_tensor(lambda e: [1.0] * len(e.tokens), torch.float32),
                "env_rewards_BT": row_tensor(lambda e: e.rewards, torch.float32),
                "turns_BT": row_tensor(lambda e: e.turns, torch.long),
                "env_errors": [e.error for e in episodes],
                "env_info": [{**e.info, "observation_cut": float(e.observation_cut)} for e in episodes],
            },
        )


class EnvironmentFailed(RuntimeError):
    """An episode's environment failed under reward.nan_policy=error (the message names the
    environment, the prompt and the turn)."""


@dataclass(frozen=True)
class EpisodeOutcome:
    """What the collector adds to a batch's scores from its episodes."""

    returns_B: torch.Tensor
    """Sum of each episode's environment rewards."""
    keep_B: torch.Tensor
    """False for episodes whose environment failed (nan_policy skip)."""
    metrics: dict[str, float]
    """env/failed, env/turns, and the mean of each number the environments' last info held (env/<key>)."""


def episode_outcome(extras: dict, env: str, nan_policy: str) -> EpisodeOutcome:
    """Returns, failures and metrics of a batch of episodes (`extras` of their GenerationOutput)."""
    errors, infos = extras["env_errors"], extras["env_info"]
    failed = [i for i, error in enumerate(errors) if error]
    if failed and nan_policy == "error":
        raise EnvironmentFailed(
            f"{env}: {errors[failed[0]]} (reward.nan_policy=error; skip drops such episodes, counted as "
            f"env/failed)"
        )
    keep_B = torch.ones(len(errors), dtype=torch.bool)
    keep_B[failed] = False
    metrics = {
        "env/failed": float(len(failed)),
        "env/turns": float(extras["turns_BT"].amax(1).float().mean()),
    }
    kept = [info for info, ok in zip(infos, keep_B.tolist(), strict=True) if ok]
    for key in sorted({k for info in kept for k in info}):
        values = [info[key] for info in kept if key in info]
        metrics[f"env/{key}"] = sum(values) / len(values)
    return EpisodeOutcome(extras["env_rewards_BT"].sum(1), keep_B, metrics)


def last_turn_mask(turns_BT: torch.Tensor) -> torch.Tensor:
    """1.0 on each episode's last turn (what the reward section scores as its answer)."""
    last_B = turns_BT.amax(1, keepdim=True)
    return ((turns_BT == last_B) & (last_B > 0)).float()


def observation_ids(tokenizer, observation: Observation) -> list[int]:
    """An observation's tokens: text as it is (no BOS), chat messages as the model's chat template
    continues the conversation with them (hpcrl.data.chat.continuation_ids). Messages the tokenizer cannot
    render stop the run: every episode would meet them."""
    if isinstance(observation, str):
        return tokenizer(observation, add_special_tokens=False)["input_ids"]
    try:
        return continuation_ids(tokenizer, observation)
    except (ConfigError, ValueError) as err:
        why = err.problems[0].message if isinstance(err, ConfigError) else str(err)
        raise EnvironmentFailed(
            f"the environment returned chat messages, which cannot be rendered: {why}"
        ) from None


def build_episode_runner(
    rollout: RolloutConfig, tokenizer, replica: ReplicaGroup | None = None
) -> EpisodeRunner | None:
    """The episode runner of `rollout.env` with its pool of environment workers (None without one).
    `replica`: the generation replica's ranks when it has several (t_g x p_g > 1): its leader alone
    steps the environments and the others receive its results (hpcrl.env.replica)."""
    if rollout.env is None:
        return None
    pool: EnvPool | ReplicaEnvPool | None = None
    if replica is None or dist.get_rank() == replica.leader:
        pool = EnvPool(
            rollout.env,
            rollout.env_timeout_s,
            rollout.env_workers,
            dict(rollout.env_args),
            observation_tokens=rollout.max_observation_tokens,
        )
    if replica is not None:
        pool = ReplicaEnvPool(pool, replica)
    codec = EpisodeCodec(
        encode_observation=lambda observation: observation_ids(tokenizer, observation),
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
    )
    limits = EpisodeLimits(rollout.max_turns, rollout.max_observation_tokens, rollout.response_tokens())
    interleave = torch.cuda.is_available() if rollout.env_interleave is None else rollout.env_interleave
    return EpisodeRunner(pool, codec, limits, interleave=interleave)


def generation_replica(groups) -> ReplicaGroup | None:
    """The replica of megatron generation groups (hpcrl.train.model.build_generation_groups) when it spans
    several ranks: t_g x p_g > 1."""
    if groups is None or groups.tensor * groups.pipeline == 1:
        return None
    return ReplicaGroup(groups.mp, groups.rank_of(0, 0, groups.dp_rank))
