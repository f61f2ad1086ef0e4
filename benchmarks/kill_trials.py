"""Fault trials of the real main job: SIGKILL `hpcrl run` at random moments, rerun it, compare bitwise.

For each checkpoint mode (sync and async save), runs `hpcrl run templates/grpo_tiny.yaml` (60 steps,
a checkpoint every 10) once uninterrupted as the reference, then `--trials` times: start the run, SIGKILL
its whole process group at a random moment (0-100 ms after a random step 1-59 was logged: inside a
step, a sync save or an async save's background write), check that
`checkpoints/latest` names a committed checkpoint that verifies (`hpcrl.ckpt.verify.verify_directory`),
rerun the same command to the end, and compare with the reference: every tensor of the final
checkpoint bitwise, and every step's metrics (all but wall-clock timings) bitwise, each step logged
exactly once.

    python benchmarks/kill_trials.py [--trials 10] [--seed 0] [--results-dir DIR]

Last line: `kill_trials: <n> SIGKILLs (<s> sync, <a> async), <k> resumed bitwise, <b> broken latest`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpcrl.bench.records import Record, write_records  # noqa: E402
from hpcrl.ckpt.commit import committed, read_latest  # noqa: E402
from hpcrl.ckpt.load import load_checkpoint  # noqa: E402
from hpcrl.ckpt.manifest import read_manifest  # noqa: E402
from hpcrl.ckpt.shards import ShardSpec  # noqa: E402
from hpcrl.ckpt.verify import verify_directory  # noqa: E402

STEPS, EVERY = 60, 10
TIMING_PREFIXES = ("time/", "share/", "tps/", "memory/")
"""Wall-clock metrics: the only ones allowed to differ between a resumed and an uninterrupted run."""


def command(run_root: Path, async_save: bool) -> list[str]:
    hpcrl = Path(sys.executable).with_name("hpcrl")
    return [
        str(hpcrl), "run", "templates/grpo_tiny.yaml", "--run_root", str(run_root),
        "--algorithm.steps", str(STEPS), "--checkpoint.every_steps", str(EVERY),
        "--checkpoint.async_save", str(async_save).lower(), "--algorithm.eval_every", "20",
        "--logging.progress", "false", "--logging.tensorboard", "false", "--logging.plot", "false",
    ]  # fmt: skip


def run_to_end(run_root: Path, async_save: bool) -> float:
    start = time.perf_counter()
    proc = subprocess.run(command(run_root, async_save), cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(
            f"kill_trials: a run to the end failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return time.perf_counter() - start


def run_and_kill(run_root: Path, async_save: bool, after_step: int, delay_s: float) -> bool:
    """Start the run; once it has logged `after_step` steps, wait `delay_s` (into the next step or the save
    after it) and SIGKILL its process group. False when the run ended before that (no kill)."""
    proc = subprocess.Popen(
        command(run_root, async_save),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the launcher and every rank die together
    )
    while proc.poll() is None and logged_steps(run_root) < after_step:
        time.sleep(0.002)  # polling a file the run appends to: the condition, not a guess of its timing
    if proc.poll() is not None:
        return False
    time.sleep(delay_s)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return True


def logged_steps(run_root: Path) -> int:
    metrics = next(run_root.glob("*/*/metrics.jsonl"), None)
    return len(metrics.read_text().splitlines()) if metrics is not None else 0


def run_dir(run_root: Path) -> Path:
    [metrics] = run_root.glob("*/*/metrics.jsonl")
    return metrics.parent


def latest_is_sound(root: Path) -> bool:
    """`latest` is absent with nothing committed yet (a kill before the first save), or names a committed
    checkpoint that verifies."""
    if not (root / "latest").exists():
        return not committed(root)
    path = read_latest(root)
    if path is None:
        return False
    try:
        verify_directory(path)
    except Exception:  # noqa: BLE001 - any failure to verify is what this counts
        return False
    return True


def progress(root: Path, ckpts: Path | None) -> tuple[int, str]:
    """(metric rows logged, the step `latest` names) when the run was killed."""
    metrics = next(root.glob("*/*/metrics.jsonl"), None)
    logged = len(metrics.read_text().splitlines()) if metrics is not None else 0
    latest = read_latest(ckpts) if ckpts is not None and (ckpts / "latest").exists() else None
    return logged, latest.name if latest is not None else "none"


def final_tensors(run: Path) -> dict:
    step = run / "checkpoints" / f"step_{STEPS:08d}"
    manifest = read_manifest(step)
    specs = [
        ShardSpec(n, t.global_shape, (0,) * len(t.global_shape), t.global_shape, t.dtype)
        for n, t in manifest.tensors.items()
    ]
    return load_checkpoint(step, specs).tensors


def step_metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]


def same_run(run: Path, reference: Path) -> bool:
    mine, ref = final_tensors(run), final_tensors(reference)
    tensors_equal = mine.keys() == ref.keys() and all(mine[k].equal(ref[k]) for k in ref)
    return tensors_equal and step_metrics(run) == step_metrics(reference)


def trials(async_save: bool, count: int, rng: random.Random, work: Path) -> tuple[int, int, int]:
    """(SIGKILLs delivered, of those resumed bitwise, broken latest) over `count` trials in one mode; a
    trial whose run finished before its kill time is drawn again."""
    mode = "async" if async_save else "sync"
    reference = work / f"{mode}-reference"
    run_to_end(reference, async_save)
    kills = bitwise = broken = 0
    while kills < count:
        root = work / f"{mode}-{kills}"
        shutil.rmtree(root, ignore_errors=True)
        after_step, delay_s = rng.randint(1, STEPS - 1), rng.uniform(0.0, 0.1)
        if not run_and_kill(root, async_save, after_step, delay_s):
            print(f"{mode:>6}: the run ended before step {after_step}; drawing again")
            continue
        ckpts = next(root.glob("*/*/checkpoints"), None)
        sound = ckpts is None or latest_is_sound(ckpts)
        broken += not sound
        logged, committed = progress(root, ckpts)
        run_to_end(root, async_save)
        equal = same_run(run_dir(root), run_dir(reference))
        bitwise += equal
        print(
            f"{mode:>6} trial {kills}: SIGKILL {delay_s * 1000:3.0f} ms after step {after_step} ({logged} logged, latest = "
            f"{committed}), latest sound {sound}, resumed bitwise {equal}"
        )
        kills += 1
    return kills, bitwise, broken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="kills per checkpoint mode")
    parser.add_argument("--seed", type=int, default=0, help="of the kill times")
    parser.add_argument("--results-dir", default=str(Path.cwd() / "results"))
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="hpcrl-kill-trials-"))
    sync = trials(False, args.trials, rng, work)
    asyn = trials(True, args.trials, rng, work)
    total, bitwise, broken = (a + b for a, b in zip(sync, asyn, strict=True))
    write_records(
        args.results_dir,
        [
            Record(
                benchmark="kill_trials",
                metric="resumed_bitwise",
                value=bitwise,
                unit="runs",
                baseline_name="sigkills",
                baseline_value=total,
                extra={"broken_latest": broken, "steps": STEPS, "every_steps": EVERY, "seed": args.seed},
            )
        ],
    )
    print(
        f"kill_trials: {total} SIGKILLs ({args.trials} sync, {args.trials} async), "
        f"{bitwise} resumed bitwise, {broken} broken latest"
    )
    return 0 if bitwise == total and broken == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
