"""The demo pipeline over many seeds, as a user runs it: `hpcrl run templates/pipelines/tiny.yaml --seed N`.

For every seed N (`--seed N --model.init_seed 1234+N --data.shuffle_seed N`: another SFT initialisation,
another data split and order, other samples), runs the CLI (one process, wall clock) and reads the figures it prints for each stage
(hpcrl.cli.pipeline.headline_lines): the SFT model's held-out exact match, the reward model's held-out
pairwise accuracy, and the RL stage's held-out task score — the task rule alone on greedy responses to
unseen prompts: `reward/heldout_task`, or `reward/heldout` where the RL reward is that rule (the demo's:
its reward-model term has weight 0) — at its first evaluation (the SFT model's weights) and its last. Seeds run one after another, each with the machine to
itself.

    python benchmarks/pipeline_demo.py [--pipeline templates/pipelines/tiny.yaml] [--seeds 0-4]
                                       [any `hpcrl run` override of every stage, e.g. --logging.plot false]

Prints a row per seed, then, last, `pipeline_demo: rl above sft on <k>/<n> seeds, median task score
<sft> -> <rl>, median wall <s> s`. Exit 0 when the RL stage ends above the SFT model on every seed.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hpcrl.bench.seeds import seed_list

REPO = Path(__file__).resolve().parents[1]
NUMBER = r"(nan|-?inf|-?[\d.]+)"
FIGURE = re.compile(rf"([\w/]+): {NUMBER} -> {NUMBER}")
STAGE_LINE = re.compile(r"^stage (\w+) \[(\d+)\] (.*)$")
TASK_SCORE = ("reward/heldout_task", "reward/heldout")
"""The RL stage's task score: the rule beside another reward, else the reward, which is the rule."""


@dataclass
class SeedRun:
    seed: int
    wall_s: float
    figures: dict[tuple[str, str], tuple[float, float]]
    """(stage, metric) -> (first, last) held-out value, as the CLI printed them."""

    def figure(self, stage: str, *metrics: str) -> tuple[float, float]:
        """The first of `metrics` the stage printed; exits naming them when it printed none."""
        for metric in metrics:
            if (stage, metric) in self.figures:
                return self.figures[(stage, metric)]
        sys.exit(
            f"seed {self.seed}: stage {stage} printed none of {metrics} (printed: {sorted(self.figures)})"
        )

    def last(self, stage: str, *metrics: str) -> float:
        return self.figure(stage, *metrics)[1]


def stage_figures(stdout: str) -> dict[tuple[str, str], tuple[float, float]]:
    """The (stage, metric) -> (first, last) figures of `hpcrl run PIPELINE`'s stage lines (element 0)."""
    out = {}
    for line in stdout.splitlines():
        match = STAGE_LINE.match(line.strip())
        if match and match.group(2) == "0":
            for metric, first, last in FIGURE.findall(match.group(3)):
                out[(match.group(1), metric)] = (float(first), float(last))
    return out


def run_seed(pipeline: str, seed: int, extra: list[str], root: Path) -> SeedRun:
    command = [sys.executable, "-m", "hpcrl", "run", pipeline, "--seed", str(seed)]
    # a seed of the whole chain: the SFT model's initialisation, the data (its split and order), sampling
    command += ["--model.init_seed", str(1234 + seed), "--data.shuffle_seed", str(seed)]
    command += ["--run_root", str(root / f"seed{seed}"), "--logging.progress", "false"]
    command += ["--logging.tensorboard", "false", *extra]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"seed {seed}: `{' '.join(command)}` exited {done.returncode}:\n{done.stderr[-3000:]}")
    return SeedRun(seed, wall, stage_figures(done.stdout))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pipeline", default="templates/pipelines/tiny.yaml")
    parser.add_argument("--seeds", type=seed_list, default=seed_list("0-4"))
    args, extra = parser.parse_known_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="pipeline_demo_") as tmp:
        for seed in args.seeds:
            run = run_seed(args.pipeline, seed, extra, Path(tmp))
            sft, rm = run.last("sft", "sft/heldout_exact_match"), run.last("rm", "rm/heldout_accuracy")
            first, last = run.figure("rl", *TASK_SCORE)
            print(
                f"seed {seed}: sft exact {sft:.3f}  rm accuracy {rm:.3f}  "
                f"rl task {first:.3f} -> {last:.3f}  wall {run.wall_s:.0f} s",
                flush=True,
            )
            runs.append(run)
    above = sum(r.last("rl", *TASK_SCORE) > r.last("sft", "sft/heldout_exact_match") for r in runs)
    sft_median = statistics.median(r.last("sft", "sft/heldout_exact_match") for r in runs)
    rl_median = statistics.median(r.last("rl", *TASK_SCORE) for r in runs)
    wall = statistics.median(r.wall_s for r in runs)
    print(
        f"pipeline_demo: rl above sft on {above}/{len(runs)} seeds, median task score "
        f"{sft_median:.3f} -> {rl_median:.3f}, median wall {wall:.0f} s"
    )
    return 0 if above == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
