"""A Slurm batch job for test_deadline_save: steps of STEP_S seconds under `--time=1` and NO warning signal.

`SaveTrigger.from_slurm` reads the time left from Slurm (`squeue -o %L`) once; at each step boundary it
compares it with SAFETY x (slowest step + slowest save). The job saves a real checkpoint when the rule
fires, stops, and writes what it saw to RESULT (JSON) so the test can check the rule against the clock.

    python -m tests.recovery._deadline_job CKPT_ROOT RESULT STEP_S SAFETY
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.shards import ShardedTensor
from hpcrl.ckpt.state import RunState
from hpcrl.ckpt.trigger import SaveTrigger


def main(ckpt_root: str, result_path: str, step_s: float, safety: float) -> None:
    started = time.monotonic()
    trigger = SaveTrigger.from_slurm(every_steps=0, safety=safety)
    time_left_at_start = trigger.time_left()
    weights = torch.arange(1024, dtype=torch.float32)
    checkpointer = Checkpointer(ckpt_root, async_save=False)
    boundaries = []
    slowest_step_s = 0.0
    for step in range(1, 100):
        step_start = time.monotonic()
        time.sleep(step_s)  # the "training step"
        weights += 1
        took = time.monotonic() - step_start
        trigger.record_step(took)
        slowest_step_s = max(slowest_step_s, took)
        left = trigger.time_left()
        decision = trigger.decide(step, None)
        boundaries.append(
            {
                "step": step,
                "time_left_s": left,
                "slowest_step_s": slowest_step_s,
                "reasons": list(decision.reasons),
            }
        )
        if decision.save:
            save_start = time.monotonic()
            checkpointer.save(step, [ShardedTensor.whole("w", weights)], RunState(step=step))
            trigger.record_save(time.monotonic() - save_start)
        if decision.stop:
            break
    result = {
        "time_left_at_start_s": time_left_at_start,
        "boundaries": boundaries,
        "elapsed_s": time.monotonic() - started,
    }
    Path(result_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
