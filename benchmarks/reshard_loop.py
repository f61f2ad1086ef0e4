"""The reshard as the RL loop runs it, against the limit of this machine: one plain all-gather.

Training t=4 -> generation t_g=2 on 4 gloo ranks (HybridFlow's micro-DP groups [0,1],[2,3]). The timed
hpcrl path is the RL step's `reshard` phase exactly (hpcrl.rl.handoff.ReshardHandoff with the megatron
engine's GenerationStore): micro-DP all-gather through the counting transport, the generation tensors
written into the store the rollout model runs on, received buffers released. The baseline, in the same
run and on the same group: one `all_gather_into_tensor` of the same bytes (each rank's training shard
stream in, the generation shard's worth out), nothing else: no engine can move these bytes faster with
this collective on this machine. Max over ranks per repetition, median over repetitions, the two timed
alternately so machine load hits both alike.

    python benchmarks/reshard_loop.py [--hidden 256] [--reps 9] [--results-dir benchmarks/results]

Last line: `reshard-in-loop: time/allgather=<x>` (goal <= 1.2).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.reshard import model_dims  # noqa: E402
from benchmarks.results import Record, write_records  # noqa: E402

LAYOUT = (4, 1, 1, 2, 1)
"""t, p, d, t_g, p_g."""


def bench_rank(rank: int, world: int, hidden: int, reps: int) -> dict:
    import torch
    import torch.distributed as dist

    from hpcrl.dist.layout import ParallelLayout
    from hpcrl.reshard.build import ENGINE_FAMILIES
    from hpcrl.reshard.engine import HybridEngine
    from hpcrl.reshard.generation import GenerationStore
    from hpcrl.reshard.params import gpt_param_metas, shard_of
    from hpcrl.reshard.planner import SPLIT, plan_rank
    from hpcrl.reshard.transport import CountingTransport, TorchTransport, make_groups
    from hpcrl.rl.handoff import ReshardHandoff

    t, p, d, t_g, p_g = LAYOUT
    layout = ParallelLayout(tensor=t, pipeline=p, data=d, rollout_tensor=t_g, rollout_pipeline=p_g)
    groups = make_groups(layout, ENGINE_FAMILIES)
    metas = gpt_param_metas(model_dims(hidden), pipeline=p)
    tp, pp, _ = layout.train_coords(rank)
    gen = torch.Generator().manual_seed(0)
    params = {
        m.name: shard_of(torch.randn(m.shape, generator=gen), m, tp, t).clone()
        for m in metas
        if m.stage == pp
    }
    plan = plan_rank(layout, metas, rank, itemsize=4, bucket_bytes=64 << 20)
    engine = HybridEngine(plan, CountingTransport(TorchTransport()), groups)
    engine.bind(params)
    store = GenerationStore(plan, torch.float32)
    handoff = ReshardHandoff(engine, store.fill)
    own = engine.store.flat[SPLIT]
    micro = groups["micro_data"]
    gathered = torch.empty(own.numel() * len(micro.ranks))

    def plain_allgather() -> None:
        dist.all_gather_into_tensor(gathered, own, group=micro.handle)

    times: dict[str, list[float]] = {"hpcrl": [], "allgather": []}
    metrics = {}
    for rep in range(reps + 1):  # rep 0 warms gloo's connections and the allocator
        for name, call in (("hpcrl", handoff), ("allgather", plain_allgather)):
            dist.barrier()
            start = time.perf_counter()
            out = call()
            elapsed = time.perf_counter() - start
            if rep:
                times[name].append(elapsed)
            if name == "hpcrl":
                metrics = out
    return {
        "times": times,
        "bytes_received": metrics["reshard/bytes_received"],
        "bound": plan.lower_bound_elements() * 4,
        "allgather_bytes": (gathered.numel() - own.numel()) * 4,
        "store_bytes": store.nbytes,
        "params": sum(m.numel for m in metas),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--hidden", type=int, default=256, help="model width (vocab 16x, ffn 4x, 8 layers)")
    args = parser.parse_args(argv)

    from hpcrl.dist.spawn import run_ranks

    results = run_ranks(bench_rank, 4, args.hidden, args.reps, timeout_s=600)
    per_rep = {
        name: [max(rep) for rep in zip(*[r["times"][name] for r in results], strict=True)]
        for name in ("hpcrl", "allgather")
    }
    t_hpcrl, t_plain = statistics.median(per_rep["hpcrl"]), statistics.median(per_rep["allgather"])
    r0 = results[0]
    assert all(r["bytes_received"] == r["bound"] == r["allgather_bytes"] for r in results), results
    mb = r0["bytes_received"] / 2**20
    print(
        f"t=4 -> t_g=2, {r0['params'] / 1e6:.1f}M params fp32, 4 gloo ranks, {args.reps} reps: each rank "
        f"receives {mb:.2f} MB (= the HybridFlow bound) and writes a {r0['store_bytes'] / 2**20:.2f} MB store"
    )
    print(
        f"hpcrl reshard phase   median {t_hpcrl * 1e3:8.2f} ms  samples {[round(x * 1e3, 2) for x in per_rep['hpcrl']]}"
    )
    print(
        f"plain all-gather      median {t_plain * 1e3:8.2f} ms  samples {[round(x * 1e3, 2) for x in per_rep['allgather']]}"
    )
    record = Record(
        benchmark="reshard_loop",
        metric="wall_s",
        value=t_hpcrl,
        unit="s",
        baseline_value=t_plain,
        baseline_name="one all_gather_into_tensor of the same bytes on the micro-DP group",
        repetitions=args.reps,
        layout="t=4->t_g=2",
        model_size=f"{r0['params'] / 1e6:.1f}M params fp32",
        samples=per_rep["hpcrl"],
        extra={"baseline_samples": per_rep["allgather"], "bytes_received": r0["bytes_received"]},
    )
    out = write_records(args.results_dir, [record])
    print(f"records: {Path(out) / 'reshard_loop.jsonl'}")
    print(f"reshard-in-loop: time/allgather={t_hpcrl / t_plain:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
