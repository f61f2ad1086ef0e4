"""Launcher cost per task, end to end: `hpcrl submit --dry-run` of a 10,000- and a 100,000-element sweep.

Each case runs the real command in a subprocess, in a temporary directory, and times its wall clock:
interpreter start and imports, checking every element, the memory preflight, writing every config, the
manifest and the sbatch scripts. Per task = wall time / elements; the child's peak RSS is read from
wait4. The sweep is a grid (100 learning rates x N/100 seeds) on the dev-cluster profile. The number of
sbatch calls is what a submit would make (the dry run's script count: ceil(N / MaxArraySize) per
resource shape; MaxArraySize from `scontrol show config` when a controller answers, else 1001).

Baseline (same run): checking one resolved config with jsonargparse (`parse_object` + `instantiate` on
ExperimentConfig), the usual per-config validation, timed on 50 configs; and one sbatch call per config.

    python benchmarks/launcher.py [--tasks 10000 100000] [--repetitions 1] [--results-dir results]

Prints the load average with each case (2 shared cores: say what else ran). Last lines: the per-task
ratio of the largest to the smallest sweep (1.0 = linear), then `launcher: <x> ms/task, <k> sbatch calls
for <n> tasks` for the largest (goal: <= 1 ms/task on 2 cores).
"""

from __future__ import annotations

import argparse
import math
import os
import re
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

LEARNING_RATES = 100
"""Grid side of optim.lr; the seed axis is tasks / LEARNING_RATES."""
BASELINE_SAMPLE = 50
DRY_RUN_LINE = re.compile(r"dry run: (\d+) config\(s\) written, (\d+) sbatch script\(s\)")


@dataclass(frozen=True)
class Run:
    """One timed `hpcrl submit --dry-run`."""

    seconds: float
    sbatch_calls: int
    peak_rss_mb: float
    load: float
    """1-minute load average when it ended."""


def write_template(directory: Path, tasks: int) -> Path:
    if tasks % LEARNING_RATES:
        raise SystemExit(f"--tasks must be a multiple of {LEARNING_RATES} (grid lr x seed), got {tasks}")
    lrs = ", ".join(f"{(i + 1) * 1e-6:.6g}" for i in range(LEARNING_RATES))
    seeds = ", ".join(map(str, range(tasks // LEARNING_RATES)))
    path = directory / "sweep.yaml"
    path.write_text(
        f"extends: {REPO / 'templates/base.yaml'}\nname: bench\nrun_root: {directory / 'runs'}\n"
        "entrypoint: hpcrl.launcher.probe:main\ncluster: {profile: local-dev}\n"
        f"sweep:\n  grid:\n    optim.lr: [{lrs}]\n    seed: [{seeds}]\n"
    )
    return path


def dry_run(tasks: int) -> Run:
    """Time `hpcrl submit --dry-run` of a `tasks`-element sweep in a fresh temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        template = write_template(directory, tasks)
        argv = [sys.executable, "-m", "hpcrl", "submit", str(template), "--dry-run"]
        argv += ["--sweep_dir", str(directory / "sweep")]
        out_path = directory / "out.txt"
        with out_path.open("w") as out:
            start = time.perf_counter()
            proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.PIPE)
            _, status, usage = os.wait4(proc.pid, 0)  # wait4: this child's own peak RSS
            seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(
                f"hpcrl submit --dry-run failed ({proc.returncode}): {proc.stderr.read()[-2000:]}"
            )
        match = DRY_RUN_LINE.search(out_path.read_text())
        if not match or int(match.group(1)) != tasks:
            raise SystemExit(f"unexpected dry-run output: {out_path.read_text()[:500]}")
        return Run(seconds, int(match.group(2)), usage.ru_maxrss / 1024, os.getloadavg()[0])


def jsonargparse_ms_per_config(sample: int = BASELINE_SAMPLE) -> float:
    """The baseline: jsonargparse checking one resolved config, per config."""
    from jsonargparse import ArgumentParser

    from hpcrl.experiment.config import ExperimentConfig
    from hpcrl.experiment.resolve import resolve

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ExperimentConfig, "cfg")
    with tempfile.TemporaryDirectory() as tmp:
        elements = resolve(write_template(Path(tmp), LEARNING_RATES)).elements[:sample]
    start = time.perf_counter()
    for element in elements:
        parser.instantiate(parser.parse_object({"cfg": element.data}))
    return (time.perf_counter() - start) * 1e3 / len(elements)


def record(tasks: int, runs: list[Run], baseline_ms: float, max_array: int | None) -> list[Record]:
    samples = [run.seconds * 1e3 / tasks for run in runs]
    extra = {
        "tasks": tasks,
        "peak_rss_mb": max(run.peak_rss_mb for run in runs),
        "load_1min": [run.load for run in runs],
        "max_array_size": max_array,
        "measured": "wall clock of `hpcrl submit --dry-run` in a subprocess",
    }
    label = f"{tasks:,}-element sweep"
    return [
        Record(
            benchmark="launcher",
            metric="ms_per_task",
            value=statistics.median(samples),
            unit="ms",
            samples=samples,
            repetitions=len(samples),
            model_size=label,
            baseline_name="jsonargparse_parse_object_per_config",
            baseline_value=baseline_ms,
            extra=extra,
        ),
        Record(
            benchmark="launcher",
            metric="sbatch_calls",
            value=runs[-1].sbatch_calls,
            unit="calls",
            model_size=label,
            baseline_name="one_sbatch_per_config",
            baseline_value=tasks,
            extra=extra,
        ),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repetitions", type=int, default=1)
    ap.add_argument(
        "--max-array-size",
        type=int,
        default=None,
        help="MaxArraySize the sbatch call count is checked against (the dry run asks scontrol, else 1001).",
    )
    ap.add_argument("--results-dir", default=str(Path.cwd() / "results"))
    args = ap.parse_args()
    tasks = sorted(args.tasks)
    baseline = jsonargparse_ms_per_config()
    per_task: dict[int, float] = {}
    records: list[Record] = []
    for n in tasks:
        runs = []
        for _ in range(args.repetitions):
            runs.append(dry_run(n))
            run = runs[-1]
            print(
                f"pass: {run.seconds:.2f} s for {n:,} tasks ({run.seconds * 1e3 / n:.3f} ms/task), "
                f"peak RSS {run.peak_rss_mb:.0f} MB, load {run.load:.2f}",
                flush=True,
            )
        per_task[n] = statistics.median(run.seconds * 1e3 / n for run in runs)
        if args.max_array_size and runs[-1].sbatch_calls != math.ceil(n / args.max_array_size):
            print(f"note: {runs[-1].sbatch_calls} scripts, not ceil({n} / {args.max_array_size})")
        records += record(n, runs, baseline, args.max_array_size)
    write_records(args.results_dir, records)
    largest, smallest = tasks[-1], tasks[0]
    print(f"baseline: jsonargparse parse_object + instantiate alone takes {baseline:.3f} ms/config")
    if largest != smallest:
        ratio = per_task[largest] / per_task[smallest]
        print(f"scaling: {largest:,} vs {smallest:,} tasks: {ratio:.2f}x the per-task time (linear = 1.0)")
    calls = records[-1].value
    print(f"launcher: {per_task[largest]:.3f} ms/task, {calls:.0f} sbatch calls for {largest} tasks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
