"""Write an HF model directory (config.json + model.safetensors + tokenizer files), atomically.

`write_random_model(cfg, out_dir, tokenizer)`: a randomly initialised model of `cfg`'s architecture and
dtype, built by `transformers` itself (its own init, seeded by `cfg.init_seed`), e.g. the tiny stand-in
`hpcrl rehearse` gives a recipe that names `model.hf_path`. The directory appears whole or not at all:
it is written beside its final name and renamed into place.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from hpcrl.errors import ConfigError, Problem
from hpcrl.train import hf_convert
from hpcrl.train.config import ModelConfig


def write_random_model(cfg: ModelConfig, out_dir: str | Path, tokenizer) -> Path:
    """An HF directory at `out_dir` (which must not exist) holding a random model of `cfg` and
    `tokenizer` (anything with `save_pretrained`)."""
    from transformers import AutoModelForCausalLM  # ~1 s: only when a directory is written

    out_dir = Path(out_dir)
    if out_dir.exists() or out_dir.is_symlink():
        raise ConfigError(
            Problem(f"{out_dir} exists: an HF directory is written only where none is", key="model.hf_path")
        )
    hf_config = hf_convert.model_config_to_hf(cfg)
    torch.manual_seed(cfg.init_seed)
    model = AutoModelForCausalLM.from_config(hf_config).to(getattr(torch, cfg.dtype))
    partial = out_dir.with_name(f".{out_dir.name}.partial-{os.getpid()}")
    try:
        model.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
        os.replace(partial, out_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return out_dir
