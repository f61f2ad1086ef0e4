"""Benchmark: what running a reward function in a killable worker process costs per batch.

    python -m benchmarks.usercode_cost [--steps 12] [--warmup 2]

Two runs of `hpcrl run templates/grpo_tiny.yaml` (the command a user runs), the same seed and steps: the
built-in rule (`reward.name: task`) and the same positional score as `reward.function` (a file, run by
hpcrl.usercode.runner: a worker started once, the batch sent and the scores returned as JSON frames).
Prints the median `time/reward_s` per step of each after the warm-up steps (the first includes the
worker's start), and the difference in ms per batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POSITIONAL = """\
def positional(prompts, responses, answers, extras):
    out = []
    for response, answer in zip(responses, answers):
        got = response.strip()
        out.append(sum(a == b for a, b in zip(got, answer)) / max(len(answer), len(got), 1))
    return out
"""


def reward_seconds(work: Path, name: str, steps: int, warmup: int, *extra: str) -> float:
    """The median time/reward_s of the steps after `warmup` of one run."""
    command = [
        sys.executable, "-m", "hpcrl", "run", str(REPO / "templates" / "grpo_tiny.yaml"),
        "--run_root", str(work / name), "--algorithm.steps", str(steps), "--algorithm.eval_every", "0",
        "--checkpoint.every_steps", "0", "--checkpoint.save_on_exit", "false", "--checkpoint.export_hf", "false",
        "--logging.tensorboard", "false", "--logging.plot", "false", "--logging.progress", "false", *extra,
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=1800)
    [metrics] = (work / name).glob("*/*/metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line]
    return statistics.median(r["time/reward_s"] for r in rows if r.get("step", 0) >= warmup)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "positional.py").write_text(POSITIONAL)
        rule = reward_seconds(work, "rule", args.steps, args.warmup)
        function = reward_seconds(
            work,
            "function",
            args.steps,
            args.warmup,
            "--reward.function",
            f"{work / 'positional.py'}:positional",
        )
    print(f"reward per batch, median of steps {args.warmup}..{args.steps - 1} (grpo_tiny, 128 samples):")
    print(f"  built-in rule (in process)    {rule * 1e3:8.2f} ms")
    print(f"  reward.function (worker)      {function * 1e3:8.2f} ms")
    print(f"  added by the worker           {(function - rule) * 1e3:8.2f} ms per batch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
