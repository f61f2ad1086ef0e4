"""Rank functions for tests/rl/test_checkpointing.py (module level, so spawned ranks can import them)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from hpcrl.ckpt.commit import read_latest
from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import read_manifest
from hpcrl.ckpt.shards import ShardSpec
from hpcrl.errors import ConfigError


def _whole(root: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Every tensor of the newest checkpoint under `root`, whole, and its run state."""
    latest = read_latest(root)
    manifest = read_manifest(latest)
    specs = [
        ShardSpec(n, t.global_shape, (0,) * len(t.global_shape), t.global_shape, t.dtype)
        for n, t in manifest.tensors.items()
    ]
    return load_checkpoint(latest, specs).tensors, manifest.state


def run_another_config_then_fine_tune(rank: int, world: int, first, other, tune, root: str) -> dict:
    from hpcrl.rl.job import main

    root_dir = Path(root)
    main(first, root_dir / "a")
    try:
        main(other, root_dir / "b")
        refused = ""
    except ConfigError as err:
        refused = str(err)
    main(tune, root_dir / "c")
    a_tensors, a_state = _whole(Path(first.checkpoint.dir))
    c_tensors, c_state = _whole(Path(tune.checkpoint.dir))
    params = [n for n in c_tensors if ".optim." not in n]
    rows = [json.loads(line) for line in (root_dir / "c" / "metrics.jsonl").read_text().splitlines()]
    return {
        "refused": refused,
        "tuned_steps": [r["step"] for r in rows],
        "params_compared": len(params),
        "same_params": all(torch.equal(a_tensors[n], c_tensors[n]) for n in params),
        "optim_steps": {float(c_tensors[n]) for n in c_tensors if ".optim.step." in n},
        "first_run_id": a_state["run_id"],
        "tuned_run_id": c_state["run_id"],
        "tune_dir_run_id": json.loads((root_dir / "c" / "run.json").read_text())["run_id"],
    }
