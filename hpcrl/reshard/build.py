"""One call from configs to a ready reshard engine for this rank (what the RL worker uses).

layout = ParallelLayout.from_config(cfg.parallel)
groups = make_groups(layout, ENGINE_FAMILIES, timeout_s=cfg.parallel.timeout_s)    # every rank
params = dict(named_global_params(model, cfg.model, train_groups))                 # read, never moved
engine = build_reshard_engine(cfg.model, layout, params, rank=rank, groups=groups)
per RL step:
    shard = engine.to_generation()
    rollout.load_weights(rollout_weights(shard, layout, rank, cfg.model))          # (hf_name, tensor)
    ... generate ...
    engine.to_training(shard)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import ConfigError, Problem
from hpcrl.reshard.engine import HybridEngine
from hpcrl.reshard.naive import NaiveEngine
from hpcrl.reshard.params import ParamMeta, gpt_param_metas, split_problems
from hpcrl.reshard.planner import plan_rank
from hpcrl.reshard.transport import CountingTransport, Group, TorchTransport, Transport

ENGINE_FAMILIES = ("micro_data", "stage_merge", "train_tensor", "train_pipeline")
"""Group families the engines use (HybridEngine: micro_data, stage_merge; naive: train_tensor/pipeline)."""


def model_param_metas(model, pipeline: int) -> list[ParamMeta]:
    """`gpt_param_metas` of a ModelConfig with the dtype a model built here has: every parameter in
    `model.dtype` (hpcrl.train.dtypes.cast_to_model_dtype). `attach` checks the built model against it."""
    return gpt_param_metas(model, pipeline, dtype=model.dtype)


def build_reshard_engine(
    model,
    layout: ParallelLayout,
    params: Mapping[str, torch.Tensor],
    *,
    rank: int,
    groups: Mapping[str, Group],
    bucket_bytes: int = 64 << 20,
    kind: Literal["hybrid", "naive"] = "hybrid",
    transport: Transport | None = None,
) -> HybridEngine | NaiveEngine:
    """Validate (before any collective), plan and build this rank's engine for a ModelConfig, reading
    the training shards from `params` (global name -> this rank's shard, hpcrl.train.model.
    named_global_params; their shapes and dtypes are checked against the plan).

    `bucket_bytes` bounds the all-gather staging buffer (the "+ one bucket" of peak memory). The transport
    defaults to a CountingTransport over torch.distributed, so volumes are always inspectable.
    """
    layout.check_model(model)
    if model.tie_word_embeddings and layout.rollout_pipeline > 1:
        raise ConfigError(
            Problem(
                "rule tied embeddings need p_g = 1: the last generation stage would need the embedding for lm_head",
                key="parallel.rollout_pipeline",
            )
        )
    metas = model_param_metas(model, layout.pipeline)
    problems = split_problems(metas, params)
    if problems:
        raise ConfigError(problems)
    plan = plan_rank(layout, metas, rank, bucket_bytes=bucket_bytes)
    transport = transport or CountingTransport(TorchTransport())
    engine = (
        NaiveEngine(plan, metas, transport, groups)
        if kind == "naive"
        else HybridEngine(plan, transport, groups)
    )
    engine.attach(params)
    return engine
