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
loads the shards it receives from the training pool through it too (hpcrl.rl.offpolicy.weights).

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
    """train -> rollout through the reshard engine, once per weight sync (a WeightSync,
    hpcrl.rl.weight_sync); returns this rank's metrics.

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

    def publish(self, version: int) -> dict[str, float]:
        """Reshard the training shards into this rank's rollout engine now (`version` is implicit: the
        engine reads the parameters as they are)."""
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


@dataclass(frozen=True)
class SideInputs:
    """What composing a rollout side of one engine kind takes."""

    rollout_cfg: RolloutConfig
    model_cfg: ModelConfig
    layout: ParallelLayout
    rank: int
    reshard: object
    generation_groups: object
    """megatron groups at the generation layout (hpcrl.train.model.build_generation_groups), for a kind
    that builds on them (EngineKind.builds_on_generation_groups); None otherwise."""
    tokens: tuple[int, int]
    """(pad_id, eos_id)."""
    written: Callable[[], Mapping[str, torch.Tensor]] | None = None
    """Verify every hand-off against these weights (see ReshardHandoff)."""


def build_rollout_side(engine_name: str, inputs: SideInputs) -> RolloutSide:
    """The rollout engine `engine_name` (a resolved kind, hpcrl.rollout.engine_rule.ENGINES) composed with
    this rank's reshard engine."""
    return _SIDES[engine_name](inputs)


def _megatron_side(i: SideInputs) -> RolloutSide:
    """megatron-core at the generation layout; its parameters are views of the store the reshard fills."""
    engine = MegatronRolloutEngine.build(
        i.model_cfg, i.generation_groups, *i.tokens, max_rows=i.rollout_cfg.max_num_seqs
    )
    store = GenerationStore.for_engine(i.reshard)
    store.bind(engine.global_params())

    def sleep() -> None:
        store.sleep()
        i.reshard.release_staging()

    handoff = ReshardHandoff(i.reshard, store=store, written=i.written)
    return RolloutSide(engine, handoff, sleep if _sleeps(i.rollout_cfg) else None)


def _delivered_side(engine: RolloutEngine, engine_name: str, i: SideInputs) -> RolloutSide:
    """An engine the generation shard is delivered to (converted, copied in) after each transition."""
    deliver = shard_loader(engine_name, engine, i.layout, i.rank, i.model_cfg)
    handoff = ReshardHandoff(i.reshard, deliver, written=i.written)
    return RolloutSide(engine, handoff, engine.sleep if _sleeps(i.rollout_cfg) else None)


def _hf_side(i: SideInputs) -> RolloutSide:
    return _delivered_side(build_rollout_engine("hf", i.rollout_cfg, i.model_cfg, *i.tokens), "hf", i)


def _vllm_side(i: SideInputs) -> RolloutSide:
    """vLLM: one engine per rank at t_g = 1; at t_g > 1 tensor-parallel over HybridFlow's strided
    generation TP groups, each rank pushing only its own generation-TP shard."""
    if i.layout.rollout_tensor > 1:
        engine = _vllm_spmd_engine(i.rollout_cfg, i.model_cfg, i.layout, i.tokens)
    else:
        engine = build_rollout_engine("vllm", i.rollout_cfg, i.model_cfg, *i.tokens)
    return _delivered_side(engine, "vllm", i)


_SIDES: dict[str, Callable[[SideInputs], RolloutSide]] = {
    "megatron": _megatron_side,
    "hf": _hf_side,
    "vllm": _vllm_side,
}
"""How each engine kind of hpcrl.rollout.engine_rule.ENGINES is composed with the reshard engine."""


def shard_loader(
    engine_name: str, engine: RolloutEngine, layout: ParallelLayout, rank: int, model_cfg: ModelConfig
) -> Callable[[object], int]:
    """How a generation shard (anything with `megatron_tensors()`: the reshard engine's, or one received
    from another pool, hpcrl.rl.offpolicy.weights) enters engine `engine_name`; returns tensors loaded.
    `layout`/`rank`: the generation layout and this rank's index in it (which TP shard it is)."""
    return _LOADERS[engine_name](engine, layout, rank, model_cfg)


def _load_megatron_names(engine, layout, rank, model_cfg) -> Callable[[object], int]:  # noqa: ARG001
    """The Megatron-named tensors copied into the generation model (`load_weights`)."""
    return lambda shard: engine.load_weights(shard.megatron_tensors())


def _load_hf_names(engine, layout, rank, model_cfg) -> Callable[[object], int]:
    """Converted to HF names (this rank's TP shard) and copied in (`load_weights`)."""

    def load(shard) -> int:
        engine.wake_up()
        return engine.load_weights(rollout_weights(shard, layout, rank, model_cfg))

    return load


def _load_vllm(engine, layout, rank, model_cfg) -> Callable[[object], int]:
    """At t_g > 1: this rank's TP shard in HF names, pushed as a shard (`load_shard`); else as HF."""
    if layout.rollout_tensor == 1:
        return _load_hf_names(engine, layout, rank, model_cfg)

    def push_shard(shard) -> int:
        engine.wake_up()
        return engine.load_shard(rollout_weights(shard, layout, rank, model_cfg))

    return push_shard


_LOADERS = {"megatron": _load_megatron_names, "hf": _load_hf_names, "vllm": _load_vllm}
"""How a generation shard enters each engine kind."""


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
