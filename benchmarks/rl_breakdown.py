"""Benchmark: time per phase of an RL step (HybridFlow §8's method: warm-up steps, then the median).

    python -m benchmarks.rl_breakdown --results-dir DIR [--template T.yaml] [--steps 15] [--warmup 10]

Runs `hpcrl run TEMPLATE` (a real run: megatron actor, rollout engine, reshard, rewards) for `steps`
steps with evaluation off, reads the driver's per-step phase timings (`time/<phase>_s` in
metrics.jsonl) and writes, per phase, a record: value = median seconds over the steps after `warmup`,
baseline `rl_step_total` = the median step time (so ratio = the phase's share), `extra.phase` = the
phase (the report plots the shares) and, where the driver logged them, tokens/s of generate and train.
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


def phase_records(rows: list[dict], warmup: int, layout: str, model_size: str) -> list:
    """Records from metrics.jsonl rows (pure: tested on real rows)."""
    from hpcrl.bench.records import Record

    steps = [r for r in rows if "time/step_s" in r and r.get("step", 0) >= warmup]
    if not steps:
        raise ValueError(f"no step after the {warmup} warm-up steps has phase timings")
    total = [r["time/step_s"] for r in steps]
    phases = sorted(
        {k[len("time/") : -len("_s")] for r in steps for k in r if k.startswith("time/")}
        - {"step", "elapsed"}
    )
    out = []
    for phase in phases:
        samples = [r.get(f"time/{phase}_s", 0.0) for r in steps]
        extra = {"phase": phase, "steps": [r.get("step") for r in steps]}
        tps = [r[f"tps/{phase}"] for r in steps if f"tps/{phase}" in r]
        if tps:
            extra["tokens_per_s"] = statistics.median(tps)
        out.append(
            Record(
                benchmark="rl_step",
                metric=f"{phase}_s",
                value=statistics.median(samples),
                unit="s",
                baseline_name="rl_step_total",
                baseline_value=statistics.median(total),
                repetitions=len(samples),
                samples=samples,
                layout=layout,
                model_size=model_size,
                extra=extra,
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", default=str(Path.cwd() / "results"))
    parser.add_argument("--template", default=str(REPO / "templates" / "grpo_tiny.yaml"))
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--label", default=None, help="model_size label (default: parameter count)")
    args = parser.parse_args(argv)

    from hpcrl.bench.records import write_records
    from hpcrl.experiment.resolve import resolve
    from hpcrl.plan.formulas import rank_params
    from hpcrl.plan.memory import dims_of

    overrides = {"algorithm.steps": args.steps, "algorithm.eval_every": 0}
    cfg = resolve(args.template, overrides).elements[0].config
    run_root = Path(tempfile.mkdtemp(prefix="hpcrl-rl-breakdown-"))
    command = [
        str(Path(sys.executable).with_name("hpcrl")),
        "run",
        args.template,
        "--run_root",
        str(run_root),
    ]
    command += ["--logging.progress", "false", "--checkpoint.every_steps", str(args.steps + 1)]
    for key, value in overrides.items():
        command += [f"--{key}", str(value)]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        print(f"rl_breakdown: FAILED with exit code {proc.returncode}")
        return 1
    [metrics] = run_root.glob("*/*/metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    par = cfg.parallel
    layout = (
        f"t={par.tensor},p={par.pipeline},d={par.data}->t_g={par.rollout_tensor},p_g={par.rollout_pipeline}"
    )
    label = args.label or f"{rank_params(dims_of(cfg), 1, 1).total / 1e6:.3g}M params"
    records = phase_records(rows, args.warmup, layout, label)
    write_records(args.results_dir, records)
    shares = ", ".join(f"{r.extra['phase']} {r.ratio:.0%}" for r in records)
    print(
        f"rl_breakdown: step {records[0].baseline_value * 1e3:.1f} ms median over {len(records[0].samples)} steps: {shares}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
