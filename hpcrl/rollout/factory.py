"""Build the rollout engine of a config (whole-model engines here; the megatron engine is composed with
the generation groups by the RL job, hpcrl.rl.handoff). Which engine runs a config: hpcrl.rollout.engine_rule.
"""

from __future__ import annotations

from pathlib import Path

from hpcrl.errors import ConfigError, Problem
from hpcrl.rollout.base import RolloutEngine
from hpcrl.rollout.config import RolloutConfig
from hpcrl.rollout.engine_rule import EngineFacts, resolve_engine
from hpcrl.rollout.hf_engine import HFRolloutEngine
from hpcrl.rollout.vllm_engine import VLLMRolloutEngine
from hpcrl.train.config import ModelConfig


def resolve_engine_name(
    cfg: RolloutConfig, rollout_tensor: int = 1, rollout_pipeline: int = 1, model=None
) -> str:
    """The engine for this machine; ConfigError naming the key when it cannot run the config."""
    name, problems = resolve_engine(
        cfg, rollout_tensor, rollout_pipeline, model or ModelConfig(), EngineFacts.here()
    )
    if problems:
        raise ConfigError(problems)
    return name


def build_rollout_engine(
    name: str,
    cfg: RolloutConfig,
    model_cfg: ModelConfig,
    pad_id: int,
    eos_id: int,
    model_dir: Path | None = None,
) -> RolloutEngine:
    """The whole-model engine `name` (resolved by the caller: hpcrl.rollout.engine_rule.resolve_engine):
    hf or vllm at t_g = p_g = 1. `model_dir`: an HF directory of the initial weights (vLLM starts from one;
    HF builds from config). The megatron engine is built with the generation groups by the RL job."""
    builder = _WHOLE_MODEL.get(name)
    if builder is None:
        raise ConfigError(
            Problem(f"engine {name!r} is built with generation groups, not here", key="rollout.engine")
        )
    return builder(cfg, model_cfg, pad_id, eos_id, model_dir)


def _hf(cfg: RolloutConfig, model_cfg: ModelConfig, pad_id: int, eos_id: int, model_dir) -> RolloutEngine:  # noqa: ARG001
    return HFRolloutEngine.from_model_config(model_cfg, pad_id, eos_id)


def _vllm(cfg: RolloutConfig, model_cfg: ModelConfig, pad_id: int, eos_id: int, model_dir) -> RolloutEngine:
    return VLLMRolloutEngine(
        str(model_dir or model_cfg.hf_path), cfg, eos_id, pad_id=pad_id, dtype=model_cfg.dtype
    )


_WHOLE_MODEL = {"hf": _hf, "vllm": _vllm}
"""The engine kinds that run one whole model per rank, by name."""
