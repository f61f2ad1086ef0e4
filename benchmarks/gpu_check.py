"""The GPU check's GRPO runs and its one summary table (launch/gpu_check.sh runs it on the lent GPU machine).

Three short runs of the main job on the GPU through the user's command (`python3 -m hpcrl run
templates/grpo_tiny.yaml`, one rank, NCCL, megatron-core actor with the megatron DDP + distributed
optimizer backend, `parallel.verify_weight_sync` on): the HF rollout engine (auto at t_g = 1 without
vLLM), the megatron rollout engine (the sharded rollout worker's code, at t_g = 1 on one GPU), and the
megatron engine in bf16 (the GPU recipes' dtype). Each must show the colocated RL step's central claim
on CUDA: every weight sync verified against megatron's param buffer, and the weights the rollout
received changed at every step (`reshard/read_checksum`), i.e. the distributed optimizer's updates
reach the model the rollout reads. From each run's metrics.jsonl:
median tokens/s of generation and training, median seconds per step phase, the peak GPU memory of
each phase (`memory/<phase>_peak_gib`, torch.cuda.max_memory_allocated, logged by the driver on CUDA),
the worst rollout-vs-trainer log-prob mismatch and the held-out reward before and after. The pytest
outcomes of the `gpu`-marked tests come from the junit file gpu_check.sh wrote.

    python3 benchmarks/gpu_check.py --out DIR [--junit DIR/gpu-tests.xml] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpcrl.rehearse.report import syncs_verified_and_moving  # noqa: E402

RUNS = {
    "grpo, HF engine": [],
    "grpo, megatron engine": ["--rollout.engine", "megatron"],
    "grpo bf16, megatron eng.": ["--rollout.engine", "megatron", "--model.dtype", "bfloat16"],
}
PHASES = ("reshard", "generate", "reward", "train")
NOT_RUN = [
    (
        "vLLM on CUDA (test_vllm_engine, vllm_spmd)",
        "vLLM's CUDA wheel pins another torch and is too large to carry",
    ),
    ("NCCL reshard and DDP over >= 2 ranks", "one GPU: NCCL forms no group of several ranks on one device"),
    ("sharded generation t_g > 1 on GPU", "needs >= 2 GPUs (one rank per GPU); runs on CPU/gloo in CI"),
]


def run_grpo(name: str, extra: list[str], out: Path, steps: int) -> dict:
    run_root = out / "runs" / name.replace(", ", "-").replace(" ", "_")
    cmd = [sys.executable, "-m", "hpcrl", "run", str(REPO / "templates" / "grpo_tiny.yaml")]
    cmd += [
        "--run_root",
        str(run_root),
        "--algorithm.steps",
        str(steps),
        "--algorithm.eval_every",
        str(steps),
    ]
    cmd += [
        "--logging.tensorboard",
        "false",
        "--logging.plot",
        "false",
        "--checkpoint.every_steps",
        "0",
        "--parallel.verify_weight_sync",
        "true",
        *extra,
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    wall = time.perf_counter() - start
    (out / f"{run_root.name}.log").write_text(proc.stdout + proc.stderr)
    files = list(run_root.rglob("metrics.jsonl"))
    rows = [json.loads(line) for line in files[0].read_text().splitlines()] if files else []
    return {"rc": proc.returncode, "wall_s": wall, "rows": rows, "tail": (proc.stdout + proc.stderr)[-800:]}


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows[1:] if key in r]  # step 1 warms up kernels and the allocator
    return statistics.median(values) if values else None


def summarize_run(run: dict) -> dict:
    steps = [r for r in run["rows"] if "reward/mean" in r]
    heldout = [r["reward/heldout"] for r in run["rows"] if r.get("reward/heldout") is not None]
    moved = syncs_verified_and_moving(steps)
    return {
        "ok": run["rc"] == 0 and bool(steps) and moved,
        "weights_moved": moved,
        "wall_s": run["wall_s"],
        "steps": len(steps),
        "tok_s_generate": _median(steps, "tps/generate"),
        "tok_s_train": _median(steps, "tps/train"),
        "phase_s": {p: _median(steps, f"time/{p}_s") for p in PHASES},
        "peak_gib": {
            p: max((r.get(f"memory/{p}_peak_gib", 0.0) for r in steps), default=0.0) for p in PHASES
        },
        "mismatch_max": max((r.get("mismatch/logprob_max", 0.0) for r in steps), default=None),
        "heldout": (heldout[0], heldout[-1]) if heldout else None,
    }


def junit_outcomes(path: Path) -> list[tuple[str, str, str]]:
    """(test id, passed/failed/skipped, first line of the reason) for every test in a junit file."""
    if not path.exists():
        return [("(no junit file)", "failed", f"{path} missing: the pytest step did not run")]
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                text = (node.get("message") or node.text or "").strip()
                reason = text.splitlines()[0][:100] if text else ""
        out.append((f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}", outcome, reason))
    return out


def _fmt(value, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def print_summary(tests: list[tuple[str, str, str]], runs: dict[str, dict]) -> None:
    print("\n== gpu-marked tests ==")
    for test, outcome, reason in tests:
        print(f"  {outcome:<8} {test}" + (f"  ({reason})" if reason else ""))
    counts = {o: sum(1 for _, x, _ in tests if x == o) for o in ("passed", "failed", "skipped")}
    print(f"  {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    print("\n== GRPO on the GPU (grpo_tiny, 1 rank) ==")
    header = f"  {'run':<24}{'ok':>4}{'steps':>6}{'gen tok/s':>11}{'train tok/s':>12}"
    header += "".join(f"{p + ' ms':>12}" for p in PHASES) + "".join(f"{p + ' GiB':>13}" for p in PHASES)
    print(header + f"{'moved':>7}{'mismatch':>10}{'held-out':>14}{'wall s':>8}")
    for name, s in runs.items():
        line = f"  {name:<24}{'yes' if s['ok'] else 'NO':>4}{s['steps']:>6}"
        line += f"{_fmt(s['tok_s_generate']):>11}{_fmt(s['tok_s_train']):>12}"
        line += "".join(f"{_fmt(None if v is None else v * 1e3, '.1f'):>12}" for v in s["phase_s"].values())
        line += "".join(f"{v:>13.3f}" for v in s["peak_gib"].values())
        held = "-" if s["heldout"] is None else f"{s['heldout'][0]:.2f}->{s['heldout'][1]:.2f}"
        moved = "yes" if s["weights_moved"] else "NO"
        print(line + f"{moved:>7}{_fmt(s['mismatch_max'], '.1e'):>10}{held:>14}{s['wall_s']:>8.0f}")
    print("\n== not run here ==")
    for what, why in NOT_RUN:
        print(f"  {what}: {why}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--junit", default=None)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = {}
    for name, extra in RUNS.items():
        run = run_grpo(name, extra, out, args.steps)
        if run["rc"] != 0:
            print(f"{name}: exit {run['rc']}\n{run['tail']}", file=sys.stderr)
        runs[name] = summarize_run(run)
    tests = junit_outcomes(Path(args.junit)) if args.junit else []
    print_summary(tests, runs)
    (out / "gpu_check.json").write_text(json.dumps({"tests": tests, "runs": runs}, indent=1))
    failed = any(o == "failed" for _, o, _ in tests) or not all(s["ok"] for s in runs.values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
