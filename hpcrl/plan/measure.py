"""Measure the peak memory of the actor's update steps on CPU, to check the planner against.

What is measured (per rank, in a fresh spawned process, real megatron-core GPTModel + hpcrl Trainer):
- `tensor_peak_bytes`: the peak of live tensor bytes on the CPU device during `steps` update steps =
  the bytes of the tensors alive when profiling starts (parameters, grads, AdamW states, the batch:
  unique storages) + the peak of the CPU allocator's running total of bytes allocated since then, as
  torch's profiler reports it with every allocation (`profile_memory=True`; the event tree's
  allocation events, `total_allocated`). One warm-up step runs first so the AdamW states exist (their
  creation is not a steady-state peak).
- `rss_delta_bytes`: process peak RSS during `steps` unprofiled steps (run before the profiled ones)
  minus the RSS measured in the same process just before the model was built (after imports and
  process-group setup), so the Python/torch runtime is subtracted. Includes allocator slack and lazily
  initialised runtime (kernels, thread pools, megatron buffers): a cross-check only.
- `rss_steady_bytes`: peak RSS during those steps minus the RSS right after the warm-up step, plus the
  state bytes above. Undercounts when the allocator keeps the warm-up's freed pages (small tensors);
  close for large ones (returned to the OS on free). Also a cross-check only.
With CUDA the same steps are measured by `torch.cuda.max_memory_allocated` (reset after the warm-up).
The batch is synthetic, of the shape the planner sizes (`update_shape`): RL's B = prompts_per_step ·
samples_per_prompt / d sequences of s = max_prompt_length + max_new_tokens tokens, the last
max_new_tokens being the response, with a GRPO-style token-mean loss; an offline stage's step of rows as
long as the model's context, with the policy's loss (SFT, DPO) or the reward model's trainer and a loss
on its last score (RM).

Public: `measure_update_peak(cfg, steps)` (spawns ranks), `update_peak_rank` (the rank function).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrl.experiment.stage_kinds import stage_of
from hpcrl.plan.memory import dims_of
from hpcrl.plan.offline import context_tokens, rows_per_step

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig


def _rss_bytes(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1)) * 1024


def _reset_peak_rss() -> None:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")


@dataclass(frozen=True)
class UpdateShape:
    """The batch of the measured update: `sequences` rows of `tokens`, the last `response` of each trained;
    `scalar`: the reward model's trainer (scalar head, a loss on each row's last score) instead of the
    policy's (log-probs, a GRPO-like token-mean loss)."""

    sequences: int
    tokens: int
    response: int
    scalar: bool = False


def update_shape(cfg: ExperimentConfig) -> UpdateShape:
    """What the planner sizes: RL's rollout batch of prompt + response rows; an offline stage's step of
    rows as long as the model's context (hpcrl.plan.offline), the response half of each trained."""
    offline = stage_of(cfg).offline
    if offline is not None:
        s = context_tokens(cfg)
        return UpdateShape(rows_per_step(cfg), s, s // 2, scalar=offline.scalar_head)
    sequences = cfg.algorithm.prompts_per_step * cfg.rollout.samples_per_prompt
    s = cfg.data.max_prompt_length + cfg.rollout.response_tokens()
    return UpdateShape(sequences, s, cfg.rollout.response_tokens())


def _grpo_like_loss(outputs, mb):
    pg = mb.token_mean(-outputs.logprobs_BT * mb.extras["advantages_BT"])
    return pg - 0.01 * mb.token_mean(outputs.entropy_BT), {}


def _score_loss(outputs, mb):
    """A loss on each row's last score, as the reward model's (hpcrl.posttrain.rm): the whole trunk is trained."""
    return (outputs.values_BT[:, -1] * mb.extras["advantages_BT"][:, -1]).mean(), {}


def _synthetic_batch(cfg: ExperimentConfig, shape: UpdateShape, seed: int):
    # torch is imported only where something is measured: `hpcrl plan` (hpcrl.plan.memory) never loads it
    import torch

    from hpcrl.train.batch import TrainBatch

    rows, s = shape.sequences, shape.tokens
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, dims_of(cfg).vocab, (rows, s), generator=gen)  # config.json's with hf_path
    attention = torch.ones(rows, s, dtype=torch.bool)
    response = torch.zeros(rows, s, dtype=torch.bool)
    response[:, -shape.response :] = True
    advantages = torch.randn(rows, s, generator=gen)
    return TrainBatch(
        input_ids_BT=ids,
        attention_mask_BT=attention,
        response_mask_BT=response,
        extras={"advantages_BT": advantages},
    )


def update_peak_rank(rank: int, world_size: int, cfg: ExperimentConfig, steps: int) -> dict:  # noqa: ARG001
    """Rank function: build the trained model (the actor, or an offline stage's), run 1 warm-up +
    `steps` profiled update steps, return peaks."""
    # torch and megatron-core (the trainer): loaded only in a measuring rank
    import torch
    from torch.profiler import ProfilerActivity, profile

    from hpcrl.train.model import build_train_groups
    from hpcrl.train.trainer import build_policy_trainer, build_reward_trainer

    par, shape = cfg.parallel, update_shape(cfg)
    groups = build_train_groups(par.tensor, par.pipeline, par.data)
    batch = _synthetic_batch(cfg, shape, seed=cfg.seed).dp_shard(groups.dp_rank, par.data)
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    baseline_rss = _rss_bytes("VmRSS")
    build, loss = (
        (build_reward_trainer, _score_loss) if shape.scalar else (build_policy_trainer, _grpo_like_loss)
    )
    trainer = build(cfg.model, cfg.optim, groups)
    trainer.update(batch, loss)  # warm-up: AdamW states are created here
    if torch.cuda.is_available():
        return _cuda_peak(trainer, batch, loss, steps, baseline_rss)
    state_bytes = _live_state_bytes(trainer, batch)
    warm_rss = _rss_bytes("VmRSS")
    _reset_peak_rss()
    for _ in range(steps):  # RSS pass, without the profiler's bookkeeping
        trainer.update(batch, loss)
    peak_rss = _rss_bytes("VmHWM")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(steps):
            trainer.update(batch, loss)
    tensor_peak = state_bytes + _peak_allocated_since_start(prof)
    params = sum(p.numel() for p in trainer.model.parameters())
    return {
        "tensor_peak_bytes": float(tensor_peak),
        "rss_delta_bytes": float(peak_rss - baseline_rss),
        "rss_steady_bytes": float(peak_rss - warm_rss + state_bytes),
        "params_on_rank": params,
        "device": "cpu",
    }


def _live_state_bytes(trainer, batch) -> int:
    """Bytes of the unique storages of the parameters, grads, optimizer states and batch tensors."""
    import torch

    tensors = [p for p in trainer.model.parameters()] + [p.grad for p in trainer.model.parameters()]
    for state in trainer.optimizer.state.values():
        tensors += [v for v in state.values() if torch.is_tensor(v)]
    if trainer.masters is not None:  # fp32 master weights of 16-bit params (optimizer state keys)
        tensors += [*trainer.masters.masters, *(m.grad for m in trainer.masters.masters)]
    tensors += [batch.input_ids_BT, batch.attention_mask_BT, batch.response_mask_BT, *batch.extras.values()]
    storages = {}
    for t in tensors:
        if t is not None:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _peak_allocated_since_start(prof) -> int:
    """Max over the profiler's CPU allocation events of the allocator's running total (bytes allocated
    since profiling started and not yet freed). Walks the event tree (torch._C._profiler, private API)."""
    from torch._C._profiler import _EventType

    peak, stack = 0, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            peak = max(peak, node.extra_fields.total_allocated)
    return peak


def _cuda_peak(trainer, batch, loss, steps: int, baseline_rss: int) -> dict:
    """On a GPU: torch.cuda.max_memory_allocated over the steps (every live CUDA tensor, as above)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    _reset_peak_rss()
    for _ in range(steps):
        trainer.update(batch, loss)
    torch.cuda.synchronize()
    return {
        "tensor_peak_bytes": float(torch.cuda.max_memory_allocated()),
        "rss_delta_bytes": float(_rss_bytes("VmHWM") - baseline_rss),
        "params_on_rank": sum(p.numel() for p in trainer.model.parameters()),
        "device": "cuda",
    }


def measure_update_peak(cfg: ExperimentConfig, steps: int = 2) -> list[dict]:
    """Per-rank peaks of `steps` actor update steps under cfg's training layout (spawned gloo ranks)."""
    from hpcrl.distributed.spawn import run_ranks  # torch: loaded only when something is measured

    return run_ranks(update_peak_rank, cfg.parallel.world_size, cfg, steps)
