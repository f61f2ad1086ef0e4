"""A tiny policy-gradient run that checkpoints (async) every few steps and resumes from `latest`.

Stands in for the GRPO driver (not written yet) to test exactly-once resume: everything that makes a
step deterministic goes through the checkpoint — parameters, AdamW state, the data cursor (epoch, index;
the per-epoch shuffle is derived from seed + epoch), python/numpy/torch RNG states — and the metrics
log is cut back to the resumed step, so every step is logged exactly once.

    python -m tests.ckpt._exactly_once ROOT METRICS STEPS EVERY [HOLD]

HOLD: the run freezes itself (SIGSTOP) before that step, so a run its test kills can never end first.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from pathlib import Path

import numpy as np
import torch

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.load import NoCheckpoint
from hpcrl.ckpt.shards import ShardedTensor
from hpcrl.ckpt.state import RunState, restore_rng

NUM_PROMPTS, BATCH, FEATURES, ACTIONS, SEED = 20, 8, 8, 4, 3  # 20 % 8 != 0: batches straddle epochs


def _shards(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[ShardedTensor]:
    shards = []
    for name, param in model.named_parameters():
        shards.append(ShardedTensor.whole(f"model.{name}", param.detach()))
        for key, value in opt.state.get(param, {}).items():
            shards.append(ShardedTensor.whole(f"optim.{key}.{name}", value.reshape(value.shape)))
    return shards


def _resume(ck: Checkpointer, model, opt) -> RunState | None:
    def specs(manifest):  # what this checkpoint holds: each candidate's own manifest says
        return [
            ShardedTensor.whole(n, torch.empty(t.global_shape, dtype=torch.float32)).spec
            for n, t in manifest.tensors.items()
        ]

    try:
        loaded = ck.load(specs, fallback=True)
    except NoCheckpoint:
        return None
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(loaded.tensors[f"model.{name}"])
            if f"optim.step.{name}" in loaded.tensors:
                opt.state[param] = {
                    k: loaded.tensors[f"optim.{k}.{name}"] for k in ("step", "exp_avg", "exp_avg_sq")
                }
    restore_rng(loaded.rng)
    return loaded.state


def _batch(cursor: dict, prompts: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Next BATCH prompts; crosses the epoch boundary mid-batch (the cursor says exactly where)."""
    rows = []
    epoch, index = cursor["epoch"], cursor["index"]
    while len(rows) < BATCH:
        order = np.random.default_rng(SEED + epoch).permutation(NUM_PROMPTS)
        take = min(BATCH - len(rows), NUM_PROMPTS - index)
        rows.extend(order[index : index + take].tolist())
        index += take
        if index == NUM_PROMPTS:
            epoch, index = epoch + 1, 0
    return prompts[rows], {"epoch": epoch, "index": index}


def main(root: str, metrics_path: str, steps: int, every: int, hold: int | None = None) -> None:
    torch.manual_seed(SEED), np.random.seed(SEED), random.seed(SEED)
    prompts = torch.randn(NUM_PROMPTS, FEATURES, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Linear(FEATURES, ACTIONS)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    ck = Checkpointer(root, keep_last=2, async_save=True)
    state = _resume(ck, model, opt) or RunState(step=0, data_cursor={"epoch": 0, "index": 0})
    metrics = Path(metrics_path)
    kept = (
        [line for line in metrics.read_text().splitlines() if json.loads(line)["step"] <= state.step]
        if metrics.exists()
        else []
    )
    metrics.write_text("".join(line + "\n" for line in kept))
    cursor = state.data_cursor
    with metrics.open("a") as log:
        for step in range(state.step + 1, steps + 1):
            if step == hold:
                os.kill(os.getpid(), signal.SIGSTOP)  # all threads stop here until the test's SIGKILL
            x, cursor = _batch(cursor, prompts)
            logits = model(x)
            actions = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1)  # torch RNG
            target = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
            noise = torch.tensor([random.random() * 0.01 + np.random.rand() * 0.01 for _ in range(BATCH)])
            reward = (actions == target).float() + noise
            logp = torch.log_softmax(logits, -1).gather(1, actions[:, None]).squeeze(1)
            loss = -((reward - reward.mean()) * logp).mean()
            opt.zero_grad()
            loss.backward()
            ck.fence()  # the optimizer step writes the saved tensors in place
            opt.step()
            log.write(json.dumps({"step": step, "loss": loss.item().hex(), "epoch": cursor["epoch"]}) + "\n")
            log.flush()
            if step % every == 0 or step == steps:
                ck.save(step, _shards(model, opt), RunState(step=step, data_cursor=dict(cursor)))
    ck.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *map(int, sys.argv[5:6]))
