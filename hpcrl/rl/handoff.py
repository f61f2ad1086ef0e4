"""The rollout side of the actor: its engine, and how the actor's weights reach it each step.

HybridFlow's colocated actor switches train -> rollout through the 3D-HybridEngine (EuroSys'25 §5):
`ReshardHandoff` runs one transition (`to_generation`), hands the generation shard to the rollout engine
(`deliver`), and releases the received buffers (`to_training`). What `deliver` is depends on the engine:
- megatron (`hpcrl.rollout.megatron_engine`): the engine's parameters are views of a `GenerationStore`,
  and the reshard engine gathers straight into it (`HybridEngine.gather_into`: no name conversion, no
  second model copy, no per-member receive buffers);
- hf / vllm: the shard converted to HF names per generation-TP shard (`hpcrl.reshard.convert`) and
  copied in by the engine's `load_weights`.

`shard_loader` is the per-engine "put this generation shard into the engine" step; the async placement
loads the shards it receives from the training pool through it too (hpcrl.rl.async_weights).

Each hand-off returns its metrics from the reshard's counting transport (this rank's bytes received and
collectives of that one transition), which the driver logs every step. With `written` (the
`parallel.verify_weight_sync` check) each transition is also checked against the optimizer's own view
of the weights (`HybridEngine.verify`): the rollout must get what the last update wrote. `sleep` frees the rollout's
memory between generation and training (generation store; vLLM's `sleep(level=1)` on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.reshard.convert import rollout_weights
from hpcrl.reshard.generation import GenerationStore
from hpcrl.rollout.base import RolloutEngine
from hpcrl.rollout.config import RolloutConfig
from hpcrl.rollout.engine_rule import sleeps_between_steps
from hpcrl.rollout.factory import build_rollout_engine
from hpcrl.rollout.megatron_engine import MegatronRolloutEngine
from hpcrl.train.config import ModelConfig


class ReshardHandoff:
    """train -> rollout through the reshard engine, once per weight sync; returns this rank's metrics.

    `deliver(shard) -> tensors` consumes a generation shard between `to_generation` and `to_training`;
    with `store` instead, the engine gathers straight into that GenerationStore (`gather_into`).
    `written() -> {name: tensor}`: the weights as the optimizer wrote them; when given, every transition
    is verified against them (WeightSyncMismatch names the parameter that differs)."""

    def __init__(
        self,
        engine,
        deliver: Callable[[object], int] | None = None,
        store: GenerationStore | None = None,
        written: Callable[[], Mapping[str, torch.Tensor]] | None = None,
    ):
        if (deliver is None) == (store is None):
            raise ValueError("give exactly one of deliver and store")
        self.engine, self.deliver, self.store, self.written = engine, deliver, store, written
        engine.record_reads = written is not None

    def _transition(self) -> int:
        if self.store is not None:
            return self.engine.gather_into(self.store)
        shard = self.engine.to_generation()
        try:
            return self.deliver(shard)
        finally:
            self.engine.to_training(shard)

    def __call__(self) -> dict[str, float]:
        before = self.engine.transport.total()
        tensors = self._transition()
        after = self.engine.transport.total()
        metrics = {
            "reshard/bytes_received": float(after.bytes_received - before.bytes_received),
            "reshard/collectives": float(after.calls - before.calls),
            "reshard/tensors": float(tensors),
        }
        if self.written is not None:
            metrics["reshard/verified_params"] = float(self.engine.verify(self.written()))
            metrics["reshard/read_checksum"] = self.engine.read_checksum()
        return metrics


@dataclass
class RolloutSide:
    """The rollout engine of this rank and the hand-off that feeds it."""

    engine: RolloutEngine
    handoff: ReshardHandoff
    sleep: Callable[[], None] | None = None
    """Frees the rollout's memory until the next hand-off (None: the engine keeps it)."""


def build_rollout_side(
    engine_name: str,
    rollout_cfg: RolloutConfig,
    model_cfg: ModelConfig,
    layout: ParallelLayout,
    rank: int,
    reshard,
    generation_groups,
    tokens: tuple[int, int],
    *,
    written: Callable[[], Mapping[str, torch.Tensor]] | None = None,
) -> RolloutSide:
    """Compose the rollout engine `engine_name` with the reshard engine `reshard` of this rank.

    `generation_groups`: megatron groups at the generation layout (hpcrl.train.model.
    build_generation_groups; used by the megatron engine only). `tokens` = (pad_id, eos_id).
    `written`: verify every hand-off against these weights (see ReshardHandoff).
    """
    if engine_name == "megatron":
        engine = MegatronRolloutEngine.build(model_cfg, generation_groups, *tokens)
        store = GenerationStore.for_engine(reshard)
        store.bind(engine.global_params())

        def sleep() -> None:
            store.sleep()
            reshard.release_staging()

        handoff = ReshardHandoff(reshard, store=store, written=written)
        return RolloutSide(engine, handoff, sleep if _sleeps(rollout_cfg) else None)
    if engine_name == "vllm" and layout.rollout_tensor > 1:
        engine = _vllm_spmd_engine(rollout_cfg, model_cfg, layout, tokens)
    else:  # hf, or vllm at t_g = 1: the generation shard converted to HF names and copied in
        engine = build_rollout_engine(rollout_cfg, model_cfg, *tokens)
    deliver = shard_loader(engine_name, engine, layout, rank, model_cfg)
    sleep = getattr(engine, "sleep", None) if _sleeps(rollout_cfg) else None
    return RolloutSide(engine, ReshardHandoff(reshard, deliver, written=written), sleep)


def shard_loader(
    engine_name: str, engine: RolloutEngine, layout: ParallelLayout, rank: int, model_cfg: ModelConfig
) -> Callable[[object], int]:
    """How a generation shard (anything with `megatron_tensors()`: the reshard engine's, or one received
    from another pool, hpcrl.rl.async_weights) enters engine `engine_name`; returns tensors loaded.
    `layout`/`rank`: the generation layout and this rank's index in it (which TP shard it is).
    - megatron: the Megatron-named tensors copied into the generation model (`load_weights`);
    - vllm at t_g > 1: this rank's TP shard in HF names, pushed as a shard (`load_shard`);
    - hf, or vllm at t_g = 1: converted to HF names and copied in (`load_weights`)."""
    if engine_name == "megatron":
        return lambda shard: engine.load_weights(shard.megatron_tensors())
    if engine_name == "vllm" and layout.rollout_tensor > 1:

        def push_shard(shard) -> int:
            engine.wake_up()
            return engine.load_shard(rollout_weights(shard, layout, rank, model_cfg))

        return push_shard

    def load(shard) -> int:
        if hasattr(engine, "wake_up"):
            engine.wake_up()
        return engine.load_weights(rollout_weights(shard, layout, rank, model_cfg))

    return load


def _vllm_spmd_engine(rollout_cfg, model_cfg, layout, tokens):
    """vLLM tensor-parallel over HybridFlow's strided generation TP groups; each rank pushes only its own
    generation-TP shard (HF names, sliced as vLLM's loader slices the full tensor for that TP rank)."""
    from hpcrl.rollout.vllm_spmd import VLLMSpmdEngine  # imports vllm: only when the engine is chosen

    pad_id, eos_id = tokens
    return VLLMSpmdEngine(
        model_cfg.hf_path,
        rollout_cfg,
        eos_id,
        tensor_groups=layout.rollout_tensor_groups(),
        pad_id=pad_id,
        dtype=model_cfg.dtype,
    )


def _sleeps(cfg: RolloutConfig) -> bool:
    return sleeps_between_steps(cfg, cuda=torch.cuda.is_available())
