"""Checkpoint benchmark: save bandwidth vs dd, async training stall vs sync save, resharded load bytes.

    python -m benchmarks.checkpoint [--dir DIR] [--mb 256] [--reps 3] [--stall-reps 9] [--results DIR]

1. save/dd: one rank's shards (--mb MiB of fp32 tensors) saved synchronously by hpcrl (plan, write,
   fsync, checksums, manifest, commit, prune) vs `dd bs=4M conv=fdatasync` of the same number of bytes
   into the same directory. MB/s each, median of the repetitions, alternating. Goal >= 0.8.
2. async_stall/sync: a CPU "training" loop (matmuls, 1 thread; before its in-place update of the saved
   tensors it calls `fence()`, as a trainer's pre-step hook does) with one async save in the middle.
   The stall is the time the loop is stopped by the checkpoint: inside `save()` and `fence()` (the
   blocking time of CheckFreq, Mohan et al. FAST'21 §3), compared with the sync save time. Goal <= 5%.
   Printed beside it, the loop's whole slowdown against the same loop without saving (min over
   alternating repetitions): on a CPU-only machine it also counts the background writer (copy,
   checksum, write, fsync) competing with the CPU "training" for cores, which a GPU job does not see.
3. load_bytes/shard: 4 gloo ranks save at (t=2, p=1, d=2); 2 ranks load at (t=1, p=2, d=1); bytes read
   (counted hyperslab reads) / bytes of the new shards. Goal 1.00. Baseline: reading every saved shard
   that intersects (what a loader without partial reads would read).
The last line reads exactly `checkpoint: save/dd=<x> async_stall/sync=<y> load_bytes/shard=<z>`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hpcrl.bench.records import Record, write_records
from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import read_manifest
from hpcrl.ckpt.shards import ShardedTensor, ShardSpec
from hpcrl.ckpt.state import RunState
from hpcrl.distributed.spawn import run_ranks

MIB = 1 << 20


def _tensors(total_mb: int, count: int = 8) -> list[ShardedTensor]:
    per = total_mb * MIB // 4 // count
    gen = torch.Generator().manual_seed(0)
    return [ShardedTensor.whole(f"w{i}", torch.randn(per, generator=gen)) for i in range(count)]


def _dd_mb_s(directory: Path, total_mb: int) -> float:
    target = directory / "dd.bin"
    start = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=4M", f"count={total_mb // 4}", "conv=fdatasync"],
        check=True,
        capture_output=True,
    )
    elapsed = time.perf_counter() - start
    target.unlink()
    return total_mb / elapsed


def _save_s(directory: Path, shards: list[ShardedTensor], step: int) -> float:
    ck = Checkpointer(directory / "sync", keep_last=1, async_save=False)
    start = time.perf_counter()
    ck.save(step, shards, RunState(step=step))
    elapsed = time.perf_counter() - start
    # the save deletes the previous checkpoint in a background thread: let it finish, so that the next
    # dd measurement has the disk to itself
    while any(".trash-" in p.name for p in (directory / "sync").iterdir()):
        time.sleep(0.005)
    return elapsed


def measure_save(directory: Path, total_mb: int, reps: int) -> tuple[list[float], list[float], float]:
    shards = _tensors(total_mb)
    nbytes = sum(s.data.numel() * 4 for s in shards)
    save_mb_s, dd_mb_s, save_s = [], [], []
    for rep in range(reps):
        dd_mb_s.append(_dd_mb_s(directory, total_mb))
        save_s.append(_save_s(directory, shards, rep + 1))
        save_mb_s.append(nbytes / MIB / save_s[-1])
    return save_mb_s, dd_mb_s, statistics.median(save_s)


def _train_loop(
    steps: int, save_at: int | None, ck: Checkpointer | None, shards: list[ShardedTensor], save_step: int = 0
) -> tuple[float, float, float]:
    """Loop time, the time the save() call itself blocked (planning), and the time fence() blocked
    (waiting for the background snapshot copy)."""
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    blocked = fenced = 0.0
    start = time.perf_counter()
    for step in range(steps):
        for _ in range(12):
            a = torch.tanh(a @ b)
        if ck is not None:  # what a trainer's pre-step hook does before the optimizer step
            t0 = time.perf_counter()
            ck.fence()
            fenced += time.perf_counter() - t0
        for s in shards:
            s.data.add_(1e-3)  # an in-place optimizer-like update every step
        if step == save_at:
            t0 = time.perf_counter()
            ck.save(save_step, shards, RunState(step=save_step))
            blocked = time.perf_counter() - t0
    elapsed = time.perf_counter() - start
    if ck is not None:
        ck.wait()
    return elapsed, blocked, fenced


def measure_async_stall(
    directory: Path, total_mb: int, reps: int
) -> tuple[float, list[float], list[float], list[float]]:
    """Stall = min loop time with an async save - min loop time without (min over alternating
    repetitions: the least disturbed run of each, since other processes share the CPU)."""
    shards = _tensors(total_mb)
    ck = Checkpointer(directory / "async", keep_last=1, async_save=True)
    _train_loop(1, 0, ck, shards, save_step=1)  # warm the snapshot buffers (first-touch page faults)
    base, with_save, blocked, fenced = [], [], [], []
    for rep in range(reps):
        base.append(_train_loop(30, None, None, shards)[0])
        elapsed, block, fence = _train_loop(30, 5, ck, shards, save_step=rep + 2)
        with_save.append(elapsed)
        blocked.append(block)
        fenced.append(fence)
    return (
        max(0.0, min(with_save) - min(base)),
        [w - b for w, b in zip(with_save, base, strict=True)],
        blocked,
        fenced,
    )


def _reshard_rank(rank: int, world_size: int, root: str, rows: int, cols: int) -> dict:
    """Save at (t=2, d=2) on 4 ranks: w [rows, cols] split by TP on dim 0, replicated over DP. Then ranks
    0-1 load at (t=1, p=2): each takes a half of dim 1 (a layout the save never had)."""
    gen = torch.Generator().manual_seed(1)
    full = torch.randn(rows, cols, generator=gen)
    tp = rank % 2
    shard = ShardedTensor(
        "w", full[tp * rows // 2 : (tp + 1) * rows // 2].clone(), (rows, cols), (tp * rows // 2, 0)
    )
    Checkpointer(root, group=dist.group.WORLD, async_save=False).save(1, [shard], RunState(step=1))
    sub = dist.new_group([0, 1])
    if rank >= 2:
        return {}
    spec = ShardSpec("w", (rows, cols), (0, rank * cols // 2), (rows, cols // 2), "float32")
    loaded = load_checkpoint(root, [spec], group=sub)
    manifest = read_manifest(loaded.path)
    naive = sum(s.box.numel * 4 for s in manifest.tensors["w"].shards if s.box.intersect(spec.box))
    assert torch.equal(loaded.tensors["w"], full[:, rank * cols // 2 : (rank + 1) * cols // 2])
    return {"bytes_read": loaded.bytes_read, "shard_bytes": spec.nbytes, "naive_bytes": naive}


def measure_reshard(directory: Path, total_mb: int) -> list[dict]:
    rows = 1024
    cols = max(2, total_mb * MIB // 4 // rows // 2 * 2)
    results = run_ranks(_reshard_rank, 4, str(directory / "reshard"), rows, cols)
    return results[:2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="Directory on the disk to measure (default: a tmp dir).")
    parser.add_argument("--mb", type=int, default=256, help="MiB per save.")
    parser.add_argument("--reps", type=int, default=3, help="Repetitions of the save and dd timings.")
    parser.add_argument(
        "--stall-reps",
        type=int,
        default=9,
        help="Alternating repetitions of the loop with and without an async save (1.5 s each pair): a "
        "min over more of them is robust to other processes sharing the CPU.",
    )
    parser.add_argument("--results", default=str(Path.cwd() / "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    directory = Path(tempfile.mkdtemp(prefix="hpcrl-ckpt-bench-", dir=args.dir))
    try:
        save_mb_s, dd_mb_s, sync_s = measure_save(directory, args.mb, args.reps)
        stall, stalls, blocked, fenced = measure_async_stall(directory, args.mb, args.stall_reps)
        reshard = measure_reshard(directory, min(args.mb, 64))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    size = f"{args.mb} MiB"
    read, ideal = sum(r["bytes_read"] for r in reshard), sum(r["shard_bytes"] for r in reshard)
    waited = [b + f for b, f in zip(blocked, fenced, strict=True)]  # per repetition: save() + fence()
    records = [
        Record(
            benchmark="checkpoint",
            metric="save_mb_s",
            value=statistics.median(save_mb_s),
            unit="MB/s",
            baseline_name="dd_fdatasync",
            baseline_value=statistics.median(dd_mb_s),
            repetitions=args.reps,
            samples=save_mb_s,
            model_size=size,
            extra={"dd_samples": dd_mb_s, "dir": str(directory.parent)},
        ),
        Record(
            benchmark="checkpoint",
            metric="async_stall_s",
            value=statistics.median(waited),
            unit="s",
            baseline_name="sync_save_s",
            baseline_value=sync_s,
            repetitions=args.stall_reps,
            samples=waited,
            model_size=size,
            extra={
                "save_call_blocked_s": blocked,
                "fence_blocked_s": fenced,
                "loop_slowdown_min_min_s": stall,
                "loop_slowdown_pairs_s": stalls,
            },
        ),
        Record(
            benchmark="checkpoint",
            metric="load_bytes",
            value=read,
            unit="bytes",
            baseline_name="new_shard_bytes",
            baseline_value=ideal,
            layout="t=2,p=1,d=2 -> t=1,p=2,d=1",
            model_size=f"{min(args.mb, 64)} MiB",
            extra={"per_rank": reshard, "naive_whole_shard_bytes": sum(r["naive_bytes"] for r in reshard)},
        ),
    ]
    write_records(args.results, records)
    for record in records:
        print(
            f"{record.metric}: {record.value:.4g} {record.unit} vs {record.baseline_name} {record.baseline_value:.4g}"
        )
    print(  # the whole slowdown: the stall plus the background writer sharing this machine's cores
        f"loop slowdown with an async save: {stall * 1e3:.1f} ms = {stall / sync_s:.3f} of a sync save "
        f"(min over {args.stall_reps} alternating pairs; median pair {statistics.median(stalls) * 1e3:.1f} ms)"
    )
    print(
        f"checkpoint: save/dd={records[0].ratio:.2f} async_stall/sync={records[1].ratio:.3f} "
        f"load_bytes/shard={records[2].ratio:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
