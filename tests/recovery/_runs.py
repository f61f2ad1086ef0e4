"""Helpers of the recovery tests: start real `hpcrl` runs, read their metrics and final checkpoints."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import torch

from hpcrl.ckpt.commit import committed, read_latest
from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import read_manifest
from hpcrl.ckpt.shards import ShardSpec

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates" / "recovery"
VOLATILE_PREFIXES = ("time/", "share/", "tps/")
"""Wall-clock metrics: the only ones allowed to differ between two runs of the same config."""


def start_run(template: Path, run_root: Path, *overrides: str, log: Path) -> subprocess.Popen:
    """`hpcrl run TEMPLATE --run_root ROOT [--key value ...]` as a child process (1 rank: in-process)."""
    cmd = [sys.executable, "-m", "hpcrl", "run", str(template), "--run_root", str(run_root), *overrides]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def run_dir_of(run_root: Path) -> Path:
    """The one run directory under `run_root` (<root>/<name>/<config id>)."""
    [run_dir] = [p.parent for p in run_root.glob("*/*/config.yaml")]
    return run_dir


def metric_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock metrics (complete lines only)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE_PREFIXES)} for r in rows]


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def latest_step(ckpt_root: Path) -> int | None:
    latest = read_latest(ckpt_root)
    return None if latest is None else read_manifest(latest).state["step"]


def committed_steps(ckpt_root: Path) -> list[int]:
    return [step for step, _ in committed(ckpt_root)]


def final_tensors(ckpt_root: Path) -> dict[str, torch.Tensor]:
    """Every tensor (parameters and AdamW state) of the newest checkpoint, whole."""
    latest = read_latest(ckpt_root)
    manifest = read_manifest(latest)
    specs = [
        ShardSpec(n, t.global_shape, (0,) * len(t.global_shape), t.global_shape, t.dtype)
        for n, t in manifest.tensors.items()
    ]
    return load_checkpoint(latest, specs).tensors


def digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names and raw bytes, in name order (two equal digests = bitwise equal state)."""
    sha = hashlib.sha256()
    for name in sorted(tensors):
        sha.update(name.encode())
        sha.update(tensors[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()
