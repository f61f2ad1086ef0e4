"""The built-in tool task over many seeds, as a user runs it: `hpcrl run templates/tool_tiny.yaml --seed N`,
with the calculator and without it (`tool: false`: the same task, rewards and token budget; every call
answered with nothing).

For every seed N (`--seed N --model.init_seed 1234+N --data.shuffle_seed N`: another initialisation,
data order and samples) and both variants, runs the CLI (one process, wall clock) and reads its
metrics.jsonl: the held-out success (greedy episodes on unseen prompts, the exact sum:
`reward/heldout_env/success`) and tool-call rate (`reward/heldout_env/tool_calls`) at the first and the
last evaluation. Runs one after another, each with the machine to itself.

    python benchmarks/tool_task.py [--template templates/tool_tiny.yaml] [--seeds 0-4]
                                   [--variants tool,no_tool] [any `hpcrl run` override]

(`--template templates/tool_chain_tiny.yaml`: the multi-step task.)

Prints a row per run, then `tool_task: held-out success with the tool <median> (<k>/<n> seeds >= 0.9),
without <median>; tool calls <first> -> <last>; median wall <s> s`. Exit 0 when every seed with the tool
reaches 0.9 and none without it does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from hpcrl.bench.seeds import seed_list

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "templates" / "tool_tiny.yaml"
SUCCESS, CALLS = "reward/heldout_env/success", "reward/heldout_env/tool_calls"


def variant_args(template: Path, variant: str) -> list[str]:
    """The overrides of a variant: none with the tool; the template's environment arguments with
    `tool: false` without it."""
    if variant == "tool":
        return []
    env_args = yaml.safe_load(template.read_text())["rollout"]["env_args"]
    return ["--rollout.env_args", json.dumps({**env_args, "tool": False})]


def run(template: Path, seed: int, variant: str, extra: list[str], root: Path) -> dict:
    command = [sys.executable, "-m", "hpcrl", "run", str(template), "--seed", str(seed)]
    command += ["--model.init_seed", str(1234 + seed), "--data.shuffle_seed", str(seed)]
    command += ["--run_root", str(root / f"{variant}{seed}"), "--logging.progress", "false"]
    command += [
        "--logging.tensorboard",
        "false",
        "--logging.plot",
        "false",
        *variant_args(template, variant),
        *extra,
    ]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(
            f"seed {seed} {variant}: `{' '.join(command)}` exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    [metrics] = (root / f"{variant}{seed}").glob("*/*/metrics.jsonl")
    rows = [r for r in map(json.loads, metrics.read_text().splitlines()) if SUCCESS in r]
    return {
        "success": (rows[0][SUCCESS], rows[-1][SUCCESS]),
        "calls": (rows[0][CALLS], rows[-1][CALLS]),
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--template", type=Path, default=TEMPLATE)
    parser.add_argument("--seeds", type=seed_list, default=seed_list("0-4"))
    parser.add_argument("--variants", default="tool,no_tool")
    args, extra = parser.parse_known_args(argv)
    results: dict[str, list[dict]] = {v: [] for v in args.variants.split(",")}
    with tempfile.TemporaryDirectory(prefix="tool_task_") as tmp:
        for seed in args.seeds:
            for variant, runs in results.items():
                r = run(args.template.resolve(), seed, variant, extra, Path(tmp))
                runs.append(r)
                print(
                    f"seed {seed} {variant:>7}: held-out success {r['success'][0]:.3f} -> {r['success'][1]:.3f}  "
                    f"tool calls {r['calls'][0]:.3f} -> {r['calls'][1]:.3f}  wall {r['wall_s']:.0f} s",
                    flush=True,
                )
    tool, bare = results.get("tool", []), results.get("no_tool", [])
    reached = sum(r["success"][1] >= 0.9 for r in tool)
    line = "tool_task:"
    if tool:
        line += (
            f" held-out success with the tool {statistics.median(r['success'][1] for r in tool):.3f}"
            f" ({reached}/{len(tool)} seeds >= 0.9);"
            f" tool calls {statistics.median(r['calls'][0] for r in tool):.3f} ->"
            f" {statistics.median(r['calls'][1] for r in tool):.3f};"
        )
    if bare:
        line += f" without it {statistics.median(r['success'][1] for r in bare):.3f};"
    line += f" median wall {statistics.median(r['wall_s'] for rs in results.values() for r in rs):.0f} s"
    print(line)
    ok = reached == len(tool) and not any(r["success"][1] >= 0.9 for r in bare)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
