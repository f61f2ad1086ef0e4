"""Export the model of a checkpoint as a Hugging Face directory (config.json + model.safetensors + the
tokenizer), one that `transformers` (or vLLM, or the next stage of a pipeline) loads on its own.

Reads the whole (unsharded) parameter tensors named `{prefix}...` (see hpcrl.ckpt.megatron), merges the
fc1 gate/up pair back into megatron's `linear_fc1.weight` = [gate; up], and converts with
hpcrl.train.hf_convert. The ModelConfig comes from the manifest (extra["models"][prefix]); the tokenizer
is the one the job trained with (hpcrl.data.tokenizer.model_tokenizer: its `model.hf_path`'s, chat
template included, or the built-in char tokenizer of a random-init model).
"""

from __future__ import annotations

from pathlib import Path

import torch

from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import CheckpointError, read_manifest
from hpcrl.ckpt.shards import ShardSpec
from hpcrl.data.tokenizer import model_tokenizer
from hpcrl.train import hf_convert
from hpcrl.train.config import ModelConfig


def export_hf(checkpoint: str | Path, out_dir: str | Path, *, prefix: str = "actor.") -> Path:
    from safetensors.torch import save_file

    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    manifest = read_manifest(checkpoint)
    models = manifest.extra.get("models", {})
    if prefix not in models:
        raise CheckpointError(
            f"{checkpoint}: no model config under prefix {prefix!r} in the manifest (has: {sorted(models)})"
        )
    cfg = ModelConfig(**models[prefix])
    names = [n for n in manifest.tensors if n.startswith(prefix) and not n.startswith(f"{prefix}optim.")]
    names = [n for n in names if not n.endswith("value_head.weight")]
    specs = [
        ShardSpec(n, t.global_shape, (0,) * len(t.global_shape), t.global_shape, t.dtype)
        for n, t in ((n, manifest.tensors[n]) for n in names)
    ]
    loaded = load_checkpoint(checkpoint, specs).tensors
    full: dict[str, torch.Tensor] = {}
    for name, tensor in loaded.items():
        name = name.removeprefix(prefix)
        if name.endswith(".gate") or name.endswith(".up"):
            base = name.rsplit(".", 1)[0]
            full[base] = torch.cat([loaded[f"{prefix}{base}.gate"], loaded[f"{prefix}{base}.up"]])
        else:
            full[name] = tensor
    hf_sd = hf_convert.megatron_to_hf_state_dict(full, cfg)
    if cfg.tie_word_embeddings:
        hf_sd.pop("lm_head.weight", None)  # HF re-ties it on load; safetensors refuses shared storage
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_convert.model_config_to_hf(cfg).save_pretrained(out_dir)
    try:
        tokenizer = model_tokenizer(cfg.hf_path, cfg.vocab_size)
    except OSError as err:  # the run's model.hf_path is not readable here
        raise CheckpointError(
            f"{cfg.hf_path}: the tokenizer the run trained with is not readable here ({err}); export where "
            "that directory is"
        ) from err
    tokenizer.save_pretrained(out_dir)
    save_file(
        {k: v.contiguous() for k, v in hf_sd.items()},
        out_dir / "model.safetensors",
        metadata={"format": "pt"},
    )
    return out_dir
