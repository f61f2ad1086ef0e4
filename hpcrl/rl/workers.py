"""The RL dataflow's own worker groups: the rollout engine's (`RolloutWorker`) and the actor's; the
trainer worker group they share with every stage that trains, and the pools, are hpcrl.train.workers
(HybridFlow §4.1-4.2: dispatch to the DP ranks of a pool, collect, hand over to the other ranks).

Shape legend: B = sequences (global unless named local), T = response tokens, S = sequence tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from hpcrl.rl.episodes import EpisodeRunner
from hpcrl.rl.experience import Experience
from hpcrl.rollout.base import GenerationOutput, RolloutEngine, SamplingParams, row_seeds
from hpcrl.rows import concat_rows, pad_columns
from hpcrl.train.logprobs import HeadOutputs
from hpcrl.train.workers import Shards, TrainerWorker

TURN_SEED_STRIDE = 0x9E3779B1
"""Turn k of an episode draws from the row seeds of `seed + k * TURN_SEED_STRIDE` (turn 1's differ from a
single-turn response's too)."""


class RolloutWorker:
    """Generation replicas: each generation-DP rank samples its share of the prompts.

    `shards` is over the generation data-parallel index (p_g x t_g blocks share one index and produce
    identical outputs; `collect` keeps one copy per index). `engine` is None on ranks outside the rollout
    pool (split placement): they contribute nothing to the all-gather over `world_group` and receive the
    global output like every other rank.
    """

    def __init__(
        self,
        engine: RolloutEngine | None,
        shards: Shards,
        world_group: dist.ProcessGroup | None,
        pad_id: int,
        sleep: Callable[[], None] | None = None,
        max_num_seqs: int | None = None,
        episodes: EpisodeRunner | None = None,
    ):
        self.engine, self.shards, self.world_group, self.pad_id = engine, shards, world_group, pad_id
        self.episodes = episodes
        """Multi-turn episodes against the environment (rollout.env); None: one response per prompt."""
        self._sleep = sleep
        self.max_num_seqs = max_num_seqs
        """Rows per engine call (waves; rollout.max_num_seqs); None = the whole share in one call."""

    def sleep(self) -> None:
        """Free the engine's generation memory until the next weight sync (between rollout and training)."""
        if self._sleep is not None:
            self._sleep()

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams,
        seed: int,
        examples: Sequence[dict[str, str]] | None = None,
    ) -> GenerationOutput:
        """One response per prompt, or with an environment one episode per prompt (`examples`: what
        each episode's environment is reset with)."""
        local = None
        if self.engine is not None:
            start, stop = self.shards.bounds(len(prompt_ids))
            # Engines that take per-row seeds sample the same rows whatever the replica split; others
            # draw from the process RNG, seeded distinct per replica and reproducible per step.
            torch.manual_seed((seed * 7919 + self.shards.index) % 2**63)  # any int seed (torch takes < 2^64)
            if stop > start:
                local = self._generate_waves(prompt_ids, start, stop, sampling, seed, examples)
        gathered = Shards(0, 1, self.world_group).collect((self.shards.index, local))
        by_index = {}
        for index, out in gathered:
            by_index.setdefault(index, out)
        return concat_rows([by_index[i] for i in sorted(by_index) if by_index[i] is not None])

    def _generate_waves(
        self, prompt_ids, start: int, stop: int, sampling: SamplingParams, seed: int, examples
    ):
        """Rows [start, stop) in waves of at most max_num_seqs; each row keeps its own seed (each turn of
        an episode its own: seed of turn k = row seed of `seed + k * TURN_SEED_STRIDE`)."""
        wave = self.max_num_seqs or (stop - start)
        episodes = self.episodes if examples is not None else None
        width = episodes.limits.width if episodes is not None else sampling.max_new_tokens
        parts = []
        for a in range(start, stop, wave):
            b = min(stop, a + wave)
            if episodes is None:
                out = self.engine.generate(prompt_ids[a:b], sampling, row_seeds(seed, a, b - a))
            else:
                out = episodes.run(
                    self.engine.generate,
                    prompt_ids[a:b],
                    examples[a:b],
                    sampling,
                    lambda turn, a=a, b=b: row_seeds(seed + turn * TURN_SEED_STRIDE, a, b - a),
                )
            parts.append(pad_columns(out, width, {"response_ids_BT": self.pad_id}))
        return concat_rows(parts)


class ActorWorker(TrainerWorker):
    """The policy: log-probs/entropy and PPO updates. Its weights reach the rollout engine through the
    job's WeightSync (hpcrl.rl.weight_sync), which the driver holds."""


def response_logprobs(exp: Experience, out: HeadOutputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs_BT, entropy_BT) of a forward's outputs, moved to response space."""
    entropy = None if out.entropy_BT is None else exp.to_response(out.entropy_BT)
    return exp.to_response(out.logprobs_BT), entropy
