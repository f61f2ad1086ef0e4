"""The CPU main job, timed from launch: `hpcrl run templates/grpo_tiny.yaml` as a user would start it.

Prints the held-out reward curve (step, seconds since launch, reward), the wall time from launch until
the held-out reward first reaches the goal (0.9) and the total wall time, and writes a record with the
2-minute target as the baseline.

    python benchmarks/rl_main.py [--template templates/grpo_tiny.yaml] [--results-dir benchmarks/results]

Last line: `rl_main: heldout <first> -> <last>, >= 0.9 at <t> s, total <T> s (goal: <= 120 s)`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.results import Record, write_records  # noqa: E402

GOAL_REWARD = 0.9
GOAL_SECONDS = 120.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", default=str(REPO / "templates" / "grpo_tiny.yaml"))
    parser.add_argument("--results-dir", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args(argv)

    run_root = Path(tempfile.mkdtemp(prefix="hpcrl-rl-main-"))
    hpcrl = Path(sys.executable).with_name("hpcrl")
    start = time.perf_counter()
    proc = subprocess.run(
        [str(hpcrl), "run", args.template, "--run_root", str(run_root), "--logging.progress", "false"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    total_s = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
        print(f"rl_main: FAILED with exit code {proc.returncode}")
        return 1
    [metrics_path] = run_root.glob("*/*/metrics.jsonl")
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    startup_s = total_s - rows[-1]["time/elapsed_s"]  # process start, imports, model build
    curve = [
        (r["step"], startup_s + r["time/elapsed_s"], r["reward/heldout"])
        for r in rows
        if r.get("reward/heldout") is not None
    ]
    print(f"run dir {metrics_path.parent}")
    print(f"{'step':>6}{'s since launch':>16}{'held-out reward':>17}{'train reward':>14}")
    train = {r["step"]: r.get("reward/mean") for r in rows}
    for step, seconds, reward in curve:
        mean = train.get(step)
        print(f"{step:>6}{seconds:>16.1f}{reward:>17.3f}{'' if mean is None else f'{mean:>14.3f}'}")
    reached = next((s for _, s, r in curve if r >= GOAL_REWARD), None)
    write_records(
        args.results_dir,
        [
            Record(
                benchmark="rl_main",
                metric="wall_s_to_heldout_0.9",
                value=reached if reached is not None else float("nan"),
                unit="s",
                baseline_name="goal_2_minutes",
                baseline_value=GOAL_SECONDS,
                model_size="90K",
                extra={"total_s": total_s, "startup_s": startup_s, "curve": curve, "template": args.template},
            )
        ],
    )
    reached_text = f"{reached:.1f} s" if reached is not None else "never"
    print(
        f"rl_main: heldout {curve[0][2]:.3f} -> {curve[-1][2]:.3f}, >= {GOAL_REWARD} at {reached_text}, "
        f"total {total_s:.1f} s (goal: <= {GOAL_SECONDS:.0f} s)"
    )
    return 0 if reached is not None and reached <= GOAL_SECONDS else 1


if __name__ == "__main__":
    raise SystemExit(main())
