"""Multi-turn episodes as a user runs them: `hpcrl run templates/tool_tiny.yaml` against the built-in
Calculator with 0 and 50 ms of latency per environment step (a sandbox's or a web tool's), one process
each, wall clock; the figures are read from the run's metrics.jsonl.

    python benchmarks/agentic.py [--steps 20] [--latency-ms 50] [--prompts 16,128] [any `hpcrl run` override]

Per configuration: episodes/s = episodes generated / summed step time, env_wait = the share of step time
the rollout spent blocked on environments (time/env_wait_s / time/step_s: neither decoding nor
training). The 50 ms environments run twice: with rollout.env_interleave true (the batch decoded in two
halves that take turns, one half's environments stepping while the other decodes) and without (the
baseline: every episode decodes its turn, then every environment steps). Each runs at every
`--prompts` count per step (x 8 samples: 128 and 1024 episodes by default): a half-batch's turn must
take as long to decode as an environment step for the wait to hide behind it, and the tiny model
decodes 64 episodes' turn in far less than 50 ms. Prints a line per run, then per prompt count
`agentic: episodes/s=<x> env_wait=<share> (<n> episodes, latency <L> ms, interleaved; not interleaved:
episodes/s=<y> env_wait=<share>, speedup <x/y>; 0 ms: episodes/s=<z>)`.
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
TEMPLATE = REPO / "templates" / "tool_tiny.yaml"
QUIET = ["--logging.tensorboard", "false", "--logging.progress", "false", "--logging.plot", "false",
         "--checkpoint.every_steps", "0", "--checkpoint.save_on_exit", "false",
         "--checkpoint.export_hf", "false", "--algorithm.eval_every", "0"]  # fmt: skip


def run(steps: int, latency_s: float, interleave: bool, extra: list[str]) -> dict[str, float]:
    """One `hpcrl run`; its episodes/s and env-wait share, summed over steps 2.. (step 1 starts workers)."""
    with tempfile.TemporaryDirectory() as root:
        args = [
            "--run_root",
            root,
            "--algorithm.steps",
            str(steps),
            "--rollout.env_interleave",
            str(interleave).lower(),
        ]
        args += [
            "--rollout.env_args",
            json.dumps({"call_reward": 0.2, "ask": "prompt", "latency_s": latency_s}),
        ]
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "hpcrl", "run", str(TEMPLATE), *args, *QUIET, *extra],
            cwd=REPO, capture_output=True, text=True, check=False,
        )  # fmt: skip
        wall = time.perf_counter() - start
        if done.returncode:
            sys.exit(f"hpcrl run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        [metrics] = Path(root).glob("*/*/metrics.jsonl")
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r and r["step"] > 0]
    step_s = sum(r["time/step_s"] for r in rows)
    episodes = len(rows) * _episodes_per_batch(extra)  # dynamic sampling off: one rollout batch a step
    return {
        "episodes_per_s": episodes / step_s,
        "env_wait": sum(r.get("time/env_wait_s", 0.0) for r in rows) / step_s,
        "step_s": step_s / len(rows),
        "wall_s": wall,
    }


def _episodes_per_batch(extra: list[str]) -> int:
    """prompts_per_step x samples_per_prompt of the template (16 x 8), or of the overrides."""
    values = {"--algorithm.prompts_per_step": 16, "--rollout.samples_per_prompt": 8}
    for key in values:
        if key in extra:
            values[key] = int(extra[extra.index(key) + 1])
    return values["--algorithm.prompts_per_step"] * values["--rollout.samples_per_prompt"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--prompts", default="16,128", help="prompts per step, comma separated")
    args, extra = parser.parse_known_args()
    latency = args.latency_ms / 1000
    summaries = []
    for prompts in [int(p) for p in args.prompts.split(",")]:
        sized = [
            *extra,
            "--algorithm.prompts_per_step",
            str(prompts),
            "--algorithm.dynamic_sampling",
            "false",
        ]
        results = {}
        for name, latency_s, interleave in (
            ("0 ms", 0.0, True),
            ("latency", latency, True),
            ("latency, one batch", latency, False),
        ):
            results[name] = r = run(args.steps, latency_s, interleave, sized)
            print(
                f"{_episodes_per_batch(sized):5d} episodes, {name:>18}: episodes/s={r['episodes_per_s']:.1f} "
                f"env_wait={r['env_wait']:.3f} step={r['step_s'] * 1000:.0f} ms wall={r['wall_s']:.1f} s",
                flush=True,
            )
        ours, base = results["latency"], results["latency, one batch"]
        summaries.append(
            f"agentic: episodes/s={ours['episodes_per_s']:.1f} env_wait={ours['env_wait']:.3f} "
            f"({_episodes_per_batch(sized)} episodes, latency {args.latency_ms:g} ms, interleaved; not interleaved: "
            f"episodes/s={base['episodes_per_s']:.1f} env_wait={base['env_wait']:.3f}, "
            f"speedup {ours['episodes_per_s'] / base['episodes_per_s']:.2f}x; "
            f"0 ms: episodes/s={results['0 ms']['episodes_per_s']:.1f})"
        )
    print("\n".join(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
