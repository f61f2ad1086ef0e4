"""Pick and build the rollout engine named by `RolloutConfig.engine` (auto: vLLM with a GPU, else HF)."""

from __future__ import annotations

from pathlib import Path

from hpcrl.errors import ConfigError, Problem
from hpcrl.rollout.base import RolloutEngine
from hpcrl.rollout.config import RolloutConfig
from hpcrl.train.config import ModelConfig


def resolve_engine_name(cfg: RolloutConfig) -> str:
    from hpcrl.rollout.vllm_engine import vllm_available

    if cfg.engine == "auto":
        return "vllm" if vllm_available() else "hf"
    if cfg.engine == "vllm" and not vllm_available():
        raise ConfigError(
            Problem("vllm needs the vllm package and a CUDA device; use hf or auto", key="rollout.engine")
        )
    return cfg.engine


def build_rollout_engine(
    cfg: RolloutConfig, model_cfg: ModelConfig, pad_id: int, eos_id: int, model_dir: Path | None = None
) -> RolloutEngine:
    """`model_dir`: an HF directory of the initial weights (vLLM starts from one; HF builds from config)."""
    name = resolve_engine_name(cfg)
    if name == "hf":
        from hpcrl.rollout.hf_engine import HFRolloutEngine

        return HFRolloutEngine.from_model_config(model_cfg, pad_id, eos_id)
    from hpcrl.rollout.vllm_engine import VLLMRolloutEngine

    if model_dir is None and model_cfg.hf_path is None:
        raise ConfigError(Problem("vllm starts from an HF directory: set model.hf_path", key="model.hf_path"))
    return VLLMRolloutEngine(str(model_dir or model_cfg.hf_path), cfg, eos_id, dtype=model_cfg.dtype)
