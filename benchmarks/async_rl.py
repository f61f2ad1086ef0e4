"""Async (one-step off-policy) placement vs colocated, grpo_tiny on the same 2 cores, in one run.

Runs `hpcrl run` twice per variant, one after another (each has the 2 cores to itself):
- colocated: templates/grpo_tiny.yaml with parallel.data 2 (2 ranks, both generate then both train);
- async: templates/grpo_tiny_async.yaml (rank 0 trains, rank 1 generates; max_off_policy_steps 1).
Per async step it reads each pool's busy time from metrics.jsonl: the rollout pool's (time/rollout_busy_s:
weight swap, generation, reward, evaluation) and the training pool's (time/train_s) plus the weight
transfer (time/transfer_s); the step time is the interval between consecutive steps' time/elapsed_s.

    overlap = sum_k step_k / sum_k max(rollout_busy_k, train_busy_k + transfer_k)     (steps after warm-up)

1.0 = perfect overlap (each step as long as its busier pool); the goal is <= 1.15. The steps/s ratio is
async / colocated over the same steps, as measured (on 2 CPU cores data parallelism already scales both
phases, so it says how the split compares, not a GPU speed-up). Held-out reward is the final policy's
(greedy, unseen prompts), same seed for both.

Variants: `fixed` = grpo_tiny (3-digit copy, 3 tokens); `varlen` = zero_digits (prompts of 0..15 digits,
answer one 0 per digit then EOS: responses of 1..16 tokens, so each batch's longest sample sets its
generation time).

    python benchmarks/async_rl.py [--variants varlen,fixed] [--seed 0] [--warmup 5] [--steps N]
                                  [--report-only] [--results-dir DIR]

Prints per variant a detail line, then `async varlen: overlap=...` and last
`async: overlap=<x> steps/s ratio=<r> heldout colocated=<a> async=<b> at step <n>` (the fixed variant).
Exit 0 when every variant's overlap is <= 1.15 and the fixed variant's held-out rewards are >= 0.9;
`--report-only` (the smoke tier's short `--steps` run: too few steps to learn, timings of a busy
machine) writes and prints the figures and exits 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpcrl.bench.records import Record, write_records  # noqa: E402

GOAL_OVERLAP, GOAL_HELDOUT = 1.15, 0.9
QUIET = ["--logging.progress", "false", "--logging.tensorboard", "false", "--logging.plot", "false"]
NO_CHECKPOINTS = [
    "--checkpoint.every_steps",
    "0",
    "--checkpoint.save_on_exit",
    "false",
    "--checkpoint.export_hf",
    "false",
]
VARIANTS: dict[str, list[str]] = {
    "fixed": ["--algorithm.steps", "250"],
    "varlen": [
        "--algorithm.steps", "400", "--data.task", "zero_digits", "--data.num_digits", "15",
        "--data.max_prompt_length", "17", "--rollout.max_new_tokens", "16",
        "--model.max_position_embeddings", "48",
    ],
}  # fmt: skip
COLOCATED = ["templates/grpo_tiny.yaml", "--parallel.data", "2", "--cluster.tasks_per_node", "2"]
ASYNC = ["templates/grpo_tiny_async.yaml", "--placement.max_off_policy_steps", "1"]


def run(template_args: list[str], extra: list[str], seed: int) -> list[dict]:
    """One `hpcrl run` to the end; its metrics rows."""
    run_root = Path(tempfile.mkdtemp(prefix="hpcrl-async-rl-"))
    hpcrl = Path(sys.executable).with_name("hpcrl")
    command = [str(hpcrl), "run", *template_args, "--seed", str(seed), "--run_root", str(run_root)]
    proc = subprocess.run(command + QUIET + NO_CHECKPOINTS + extra, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(
            f"async_rl: {' '.join(template_args)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    [path] = run_root.glob("*/*/metrics.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    shutil.rmtree(run_root)
    return rows


@dataclass
class Figures:
    overlap: float
    """Async step time over the busier pool's time, summed over the steps after warm-up."""
    overlap_of_means: float
    """The same with each pool's mean busy time (a deeper pipeline's bound)."""
    async_steps_s: float
    colocated_steps_s: float
    rollout_busy_s: float
    train_busy_s: float
    transfer_s: float
    async_step_s: float
    colocated_step_s: float
    heldout_colocated: float
    heldout_async: float
    steps: int

    @property
    def ratio(self) -> float:
        return self.async_steps_s / self.colocated_steps_s


def step_rows(rows: list[dict], warmup: int) -> list[dict]:
    """Training steps after `warmup` (the final evaluation's row has no step metrics)."""
    return [r for r in rows if "time/step_s" in r and r["step"] >= warmup]


def periods(rows: list[dict], warmup: int) -> list[float]:
    """Wall time between consecutive steps' ends, for the steps after `warmup`."""
    elapsed = {r["step"]: r["time/elapsed_s"] for r in rows if "time/step_s" in r}
    return [elapsed[s] - elapsed[s - 1] for s in sorted(elapsed) if s >= max(warmup, 1)]


def figures(colocated: list[dict], asynchronous: list[dict], warmup: int) -> Figures:
    steps = step_rows(asynchronous, warmup)
    rollout = [r["time/rollout_busy_s"] for r in steps]
    train = [r.get("time/train_s", 0.0) for r in steps]
    transfer = [r["time/transfer_s"] for r in steps]
    async_periods, colocated_periods = periods(asynchronous, warmup), periods(colocated, warmup)
    busier = [max(a, b + c) for a, b, c in zip(rollout, train, transfer, strict=True)]
    n = len(steps)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return Figures(
        overlap=sum(async_periods) / sum(busier),
        overlap_of_means=mean(async_periods) / max(mean(rollout), mean(train) + mean(transfer)),
        async_steps_s=n / sum(async_periods),
        colocated_steps_s=len(colocated_periods) / sum(colocated_periods),
        rollout_busy_s=mean(rollout),
        train_busy_s=mean(train),
        transfer_s=mean(transfer),
        async_step_s=mean(async_periods),
        colocated_step_s=mean(colocated_periods),
        heldout_colocated=colocated[-1]["reward/heldout"],
        heldout_async=asynchronous[-1]["reward/heldout"],
        steps=asynchronous[-1]["step"],
    )


def line(label: str, f: Figures) -> str:
    return (
        f"{label}: overlap={f.overlap:.3f} steps/s ratio={f.ratio:.3f} heldout colocated="
        f"{f.heldout_colocated:.3f} async={f.heldout_async:.3f} at step {f.steps}"
    )


def detail(variant: str, f: Figures) -> str:
    return (
        f"{variant:>6}: async step {f.async_step_s * 1e3:.1f} ms = {f.overlap:.3f} x max(rollout busy "
        f"{f.rollout_busy_s * 1e3:.1f} ms, train {f.train_busy_s * 1e3:.1f} ms + transfer "
        f"{f.transfer_s * 1e3:.2f} ms) [of means: {f.overlap_of_means:.3f}]; colocated (d=2) step "
        f"{f.colocated_step_s * 1e3:.1f} ms; steps/s async {f.async_steps_s:.1f} vs colocated "
        f"{f.colocated_steps_s:.1f}"
    )


def record(variant: str, f: Figures, seed: int) -> list[Record]:
    extra = {"variant": variant, "seed": seed, **vars(f)}
    common = {"benchmark": "async_rl", "model_size": "90K", "extra": extra}
    layout = "train t=1,p=1,d=1 + rollout t_g=1,d_r=1 (m=1) vs colocated d=2"
    return [
        Record(
            metric=f"overlap_{variant}", value=f.overlap, unit="x", baseline_name="perfect_overlap",
            baseline_value=1.0, layout=layout, **common,
        ),
        Record(
            metric=f"steps_per_s_{variant}", value=f.async_steps_s, unit="steps/s", baseline_name="colocated_d2",
            baseline_value=f.colocated_steps_s, layout=layout, **common,
        ),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="varlen,fixed", help="comma list of: " + ",".join(VARIANTS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    parser.add_argument(
        "--steps", type=int, default=None, help="RL steps of every run (default: the variant's)"
    )
    parser.add_argument("--report-only", action="store_true", help="exit 0 whatever the figures")
    parser.add_argument("--results-dir", default=str(Path.cwd() / "results"))
    args = parser.parse_args(argv)
    steps = [] if args.steps is None else ["--algorithm.steps", str(args.steps)]
    variants = [v for v in args.variants.split(",") if v]
    lines, records, ok = [], [], True
    for variant in variants:
        start = time.perf_counter()
        colocated = run(COLOCATED, VARIANTS[variant] + steps, args.seed)
        asynchronous = run(ASYNC, VARIANTS[variant] + steps, args.seed)
        f = figures(colocated, asynchronous, args.warmup)
        print(f"{detail(variant, f)} ({time.perf_counter() - start:.0f} s)", flush=True)
        lines.append(line("async" if variant == "fixed" else f"async {variant}", f))
        records += record(variant, f, args.seed)
        ok &= f.overlap <= GOAL_OVERLAP
        if variant == "fixed":  # the main job's goal; the variable-length task's figures are reported
            ok &= min(f.heldout_colocated, f.heldout_async) >= GOAL_HELDOUT
    write_records(args.results_dir, records)
    for text in sorted(lines, key=lambda text: text.startswith("async:")):  # the fixed variant's line last
        print(text)
    return 0 if ok or args.report_only else 1


if __name__ == "__main__":
    raise SystemExit(main())
