"""Launcher cost per task: expand + validate + write configs + render sbatch + write manifest.

A 10,000-config sweep (grid 100 x 100) on the dev-cluster profile, in a temporary directory. Nothing is
submitted: the number of sbatch calls is what a submit would make, ceil(N / MaxArraySize) per resource
shape (MaxArraySize from `scontrol show config` when a controller answers, else --max-array-size).

Baseline (same run): checking each resolved config with jsonargparse (`parse_object` on
ExperimentConfig), the usual per-config validation, timed on a sample and reported per task; and
one sbatch call per config for the call count.

    python benchmarks/launcher.py [--tasks 10000] [--results-dir results]

Last line: `launcher: <x> ms/task, <k> sbatch calls for <n> tasks` (goal <= 2 ms/task).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.results import Record, write_records  # noqa: E402
from hpcrl.config.resolve import resolve  # noqa: E402
from hpcrl.launcher import slurm, sweeps  # noqa: E402


def write_template(directory: Path, tasks: int) -> Path:
    side = math.isqrt(tasks)
    if side * side != tasks:
        raise SystemExit(f"--tasks must be a square (grid side x side), got {tasks}")
    lrs = ", ".join(f"{(i + 1) * 1e-6:.6g}" for i in range(side))
    path = directory / "sweep.yaml"
    path.write_text(
        f"extends: {REPO / 'templates/base.yaml'}\nname: bench\nrun_root: {directory / 'runs'}\n"
        "entrypoint: hpcrl.launcher.probe:main\ncluster: {profile: local-dev}\n"
        f"sweep:\n  grid:\n    optim.lr: [{lrs}]\n    seed: [{', '.join(map(str, range(side)))}]\n"
    )
    return path


def one_pass(directory: Path, tasks: int, max_array: int) -> tuple[float, int]:
    """Seconds for expand + render + write (configs and manifest), and the sbatch calls it plans."""
    template = write_template(directory, tasks)
    start = time.perf_counter()
    sweep = resolve(template)
    manifest = sweeps.prepare(sweep, directory / "sweep")
    scripts = sweeps.render_scripts(sweep, manifest, max_array, sys.executable)
    elapsed = time.perf_counter() - start
    assert len(sweep.elements) == tasks and len(manifest.entries) == tasks
    return elapsed, len(scripts)


def jsonargparse_ms_per_config(sweep, sample: int = 50) -> float:
    from jsonargparse import ArgumentParser

    from hpcrl.config.experiment import ExperimentConfig

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ExperimentConfig, "cfg")
    start = time.perf_counter()
    for element in sweep.elements[:sample]:
        parser.instantiate(parser.parse_object({"cfg": element.data}))
    return (time.perf_counter() - start) * 1e3 / min(sample, len(sweep.elements))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--max-array-size", type=int, default=None, help="Default: ask scontrol, else 1001.")
    ap.add_argument("--results-dir", default=str(REPO / "results"))
    args = ap.parse_args()
    max_array = args.max_array_size
    if max_array is None:
        try:
            max_array = slurm.max_array_size()
        except Exception:  # noqa: BLE001 - no controller here: Slurm's default
            max_array = slurm.DEFAULT_MAX_ARRAY_SIZE
    samples, calls = [], 0
    for _ in range(args.repetitions):
        with tempfile.TemporaryDirectory() as tmp:
            seconds, calls = one_pass(Path(tmp), args.tasks, max_array)
        samples.append(seconds * 1e3 / args.tasks)
        print(f"pass: {seconds:.2f} s for {args.tasks} tasks ({samples[-1]:.3f} ms/task)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        baseline = jsonargparse_ms_per_config(resolve(write_template(Path(tmp), args.tasks)))
    ms_per_task = statistics.median(samples)
    write_records(
        args.results_dir,
        [
            Record(
                benchmark="launcher",
                metric="ms_per_task",
                value=ms_per_task,
                unit="ms",
                samples=samples,
                repetitions=len(samples),
                baseline_name="jsonargparse_parse_object_per_config",
                baseline_value=baseline,
                extra={"tasks": args.tasks, "max_array_size": max_array},
            ),
            Record(
                benchmark="launcher",
                metric="sbatch_calls",
                value=calls,
                unit="calls",
                baseline_name="one_sbatch_per_config",
                baseline_value=args.tasks,
                extra={"tasks": args.tasks, "max_array_size": max_array},
            ),
        ],
    )
    print(f"baseline: jsonargparse parse_object + instantiate alone takes {baseline:.3f} ms/config")
    print(f"launcher: {ms_per_task:.3f} ms/task, {calls} sbatch calls for {args.tasks} tasks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
