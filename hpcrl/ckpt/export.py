"""Export the model of a checkpoint as a Hugging Face directory (config.json + model.safetensors + the
tokenizer), one that `transformers` (or vLLM, or the next stage of a pipeline) loads on its own, and
`hpcrl-export.json` listing every file's size and sha256 (hpcrl.ckpt.export_manifest), written last.

A model with a scalar head (`value_head.weight`: a reward model, or a PPO critic) exports as
`*ForSequenceClassification` with num_labels = 1: its `score.weight` is the head, and transformers scores
a sequence at its last non-padding token, which is where hpcrl's reward model reads its score
(hpcrl.posttrain.rm); `reward.name: model` loads such a directory.

Reads the whole (unsharded) parameter tensors named `{prefix}...` (see hpcrl.ckpt.megatron), merges the
fc1 gate/up pair back into megatron's `linear_fc1.weight` = [gate; up], and converts with
hpcrl.train.hf_convert. The ModelConfig comes from the manifest (extra["models"][prefix]); the tokenizer
is the one the job trained with (hpcrl.data.tokenizer.model_tokenizer: its `model.hf_path`'s, chat
template included, or the built-in char tokenizer of a random-init model).
"""

from __future__ import annotations

from pathlib import Path

import torch

from hpcrl.ckpt.export_manifest import write_export_manifest
from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import CheckpointError, read_manifest
from hpcrl.ckpt.shards import ShardSpec
from hpcrl.data.tokenizer import model_tokenizer
from hpcrl.train import hf_convert
from hpcrl.train.config import ModelConfig


def export_hf(checkpoint: str | Path, out_dir: str | Path, *, prefix: str | None = None) -> Path:
    """Write the `prefix` model of `checkpoint` to `out_dir`; prefix None: the checkpoint's only model,
    or its "actor." (an RL checkpoint also holds the critic)."""
    from safetensors.torch import save_file

    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    manifest = read_manifest(checkpoint)
    models = manifest.extra.get("models", {})
    if prefix is None:
        prefix = next(iter(models)) if len(models) == 1 else "actor."
    if prefix not in models:
        raise CheckpointError(
            f"{checkpoint}: no model config under prefix {prefix!r} in the manifest (has: {sorted(models)})"
        )
    cfg = ModelConfig(**models[prefix])
    names = [n for n in manifest.tensors if n.startswith(prefix) and not n.startswith(f"{prefix}optim.")]
    head = f"{prefix}value_head.weight"
    scalar = head in manifest.tensors
    specs = [
        ShardSpec(n, t.global_shape, (0,) * len(t.global_shape), t.global_shape, t.dtype)
        for n, t in ((n, manifest.tensors[n]) for n in names)
    ]
    loaded = load_checkpoint(checkpoint, specs).tensors
    full = _merged_fc1({n.removeprefix(prefix): t for n, t in loaded.items() if n != head})
    hf_sd = hf_convert.megatron_to_hf_state_dict(full, cfg)
    if cfg.tie_word_embeddings or scalar:
        hf_sd.pop("lm_head.weight", None)  # HF re-ties it on load; safetensors refuses shared storage
    tokenizer = _tokenizer(cfg)
    hf_config = hf_convert.model_config_to_hf(cfg)
    if scalar:
        hf_sd["score.weight"] = loaded[head]
        hf_config.architectures = [type(hf_config).__name__.replace("Config", "ForSequenceClassification")]
        hf_config.num_labels, hf_config.pad_token_id = 1, tokenizer.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    save_file(
        {k: v.contiguous() for k, v in hf_sd.items()},
        out_dir / "model.safetensors",
        metadata={"format": "pt"},
    )
    write_export_manifest(out_dir)  # last: its presence says the export is complete
    return out_dir


def _merged_fc1(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Megatron's `linear_fc1.weight` = [gate; up] from the checkpoint's separate halves."""
    full: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith(".gate") or name.endswith(".up"):
            base = name.rsplit(".", 1)[0]
            full[base] = torch.cat([tensors[f"{base}.gate"], tensors[f"{base}.up"]])
        else:
            full[name] = tensor
    return full


def _tokenizer(cfg: ModelConfig):
    try:
        return model_tokenizer(cfg.hf_path, cfg.vocab_size)
    except OSError as err:  # the run's model.hf_path is not readable here
        raise CheckpointError(
            f"{cfg.hf_path}: the tokenizer the run trained with is not readable here ({err}); export where "
            "that directory is"
        ) from err
