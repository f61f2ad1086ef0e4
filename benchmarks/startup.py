"""Start-up of a local multi-rank run, end to end: `hpcrl run templates/grpo_tiny.yaml` for one step at
1, 4 and 8 ranks (`--parallel.data N`), ranks forked from the element's rank server (hpcrl's way:
torch, megatron-core and the entrypoint imported once) vs ranks started as one interpreter each (the
baseline, `HPCRL_LOCAL_RANK_START=exec`: what the launcher did before, and what srun does on Slurm).

Each case runs the real command in a subprocess and times its wall clock and its CPU (the launcher's
and every descendant's, from wait4: the server waits for its ranks, the launcher for the server). The
1-rank run is in-process in both modes (no server), so it is timed once per mode as the reference.

    python benchmarks/startup.py [--ranks 1 4 8] [--reps 1] [--results-dir results]

Last lines: `startup: <N> ranks <x> s vs <y> s one interpreter per rank (<r>x)` per N, then the goal's
figure, `startup: 8 ranks / 1 rank = <a> (forked) vs <b> (exec)` (goal: <= 2), and the CPU each rank
after the first adds, two ways: from 1 to 8 ranks (an upper bound of a rank's start-up: it also holds the
launcher's and the rank server's own start, which the in-process 1-rank run has not, and the rank's share
of the step) and from 4 to 8 ranks (the marginal rank: those fixed costs cancel).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpcrl.bench.records import Record, write_records  # noqa: E402
from hpcrl.launcher.rank_server import START_ENV  # noqa: E402

TEMPLATE = REPO / "templates" / "grpo_tiny.yaml"
ONE_STEP = ["--algorithm.steps", "1", "--algorithm.prompts_per_step", "8", "--algorithm.eval_every", "0"]
QUIET = ["--logging.tensorboard", "false", "--logging.progress", "false", "--logging.plot", "false"]


@dataclass(frozen=True)
class Run:
    wall_s: float
    cpu_s: float


def run_once(ranks: int, mode: str, root: Path) -> Run:
    """Time `hpcrl run` of one step on `ranks` local ranks started the `mode` way."""
    argv = [sys.executable, "-m", "hpcrl", "run", str(TEMPLATE), "--parallel.data", str(ranks)]
    argv += ["--run_root", str(root / f"{mode}-{ranks}-{time.monotonic_ns()}"), *ONE_STEP, *QUIET]
    env = {**os.environ, START_ENV: mode}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    out = proc.stdout.read().decode(errors="replace")
    proc.stdout.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"startup: {ranks} ranks ({mode}) failed:\n{out[-3000:]}")
    return Run(wall, usage.ru_utime + usage.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--results-dir", type=Path, default=Path.cwd() / "results")
    args = parser.parse_args(argv)
    ranks = sorted(set(args.ranks) | {1})
    runs: dict[tuple[str, int], list[Run]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.reps):
            for n in ranks:
                for mode in ("exec", "fork"):
                    run = run_once(n, mode, Path(tmp))
                    runs.setdefault((mode, n), []).append(run)
                    load = os.getloadavg()[0]
                    print(
                        f"  {n} ranks {mode}: {run.wall_s:.1f} s wall, {run.cpu_s:.1f} s CPU (load {load:.1f})"
                    )
    wall = {key: statistics.median(r.wall_s for r in rs) for key, rs in runs.items()}
    cpu = {key: statistics.median(r.cpu_s for r in rs) for key, rs in runs.items()}
    records = []
    for n in ranks:
        records.append(_record("wall_s", n, wall, runs, "s"))
        records.append(_record("cpu_s", n, cpu, runs, "s"))
        print(
            f"startup: {n} ranks {wall['fork', n]:.1f} s vs {wall['exec', n]:.1f} s one interpreter per rank "
            f"({wall['exec', n] / wall['fork', n]:.2f}x)"
        )
    top = ranks[-1]
    if top > 1:
        scale = {mode: wall[mode, top] / wall[mode, 1] for mode in ("fork", "exec")}
        per_rank = {mode: (cpu[mode, top] - cpu[mode, 1]) / (top - 1) for mode in ("fork", "exec")}
        below = ranks[-2]
        marginal = {mode: (cpu[mode, top] - cpu[mode, below]) / (top - below) for mode in ("fork", "exec")}
        records.append(_derived(f"wall_{top}_ranks_over_1", scale, "x", f"d={top}"))
        note = "upper bound of a rank's start-up: includes its share of the one step"
        records.append(_derived("cpu_s_per_extra_rank", per_rank, "s", f"d={top}", note))
        if below > 1:
            note = "launcher and rank server start cancel; the rank's step share does not"
            records.append(_derived("cpu_s_per_marginal_rank", marginal, "s", f"d={below}->{top}", note))
        print(
            f"startup: {top} ranks / 1 rank = {scale['fork']:.2f} (forked) vs {scale['exec']:.2f} (exec); goal <= 2"
        )
        print(
            f"startup: CPU per rank after the first {per_rank['fork']:.2f} s (forked) vs "
            f"{per_rank['exec']:.2f} s (exec), step share included"
        )
        if below > 1:
            print(
                f"startup: CPU per rank from {below} to {top} ranks {marginal['fork']:.2f} s (forked) vs "
                f"{marginal['exec']:.2f} s (exec); goal <= 0.5"
            )
    write_records(args.results_dir, records)
    return 0


def _derived(metric: str, figure: dict[str, float], unit: str, layout: str, note: str = "") -> Record:
    """A figure computed from several runs (a ratio, a slope): forked vs exec, no samples of its own."""
    return Record(
        benchmark="startup",
        metric=metric,
        value=figure["fork"],
        unit=unit,
        baseline_name="one_interpreter_per_rank",
        baseline_value=figure["exec"],
        layout=layout,
        extra={"note": note} if note else {},
    )


def _record(metric: str, n: int, figure: dict, runs: dict, unit: str) -> Record:
    samples = [getattr(r, metric) for r in runs["fork", n]]
    return Record(
        benchmark="startup",
        metric=metric,
        value=figure["fork", n],
        unit=unit,
        samples=samples,
        repetitions=len(samples),
        baseline_name="one_interpreter_per_rank",
        baseline_value=figure["exec", n],
        layout=f"d={n}",
        model_size="grpo_tiny",
    )


if __name__ == "__main__":
    raise SystemExit(main())
