"""Cross-pool weight transfer (async RL, split pools): hpcrl's sharded plan vs a full-weight broadcast.

For a table of pool pairs (training pool p-t-d, disjoint rollout pool p_g-t_g-d_r; up to 8 spawned gloo
ranks, one spawn for the whole table) both transfers run on the same model in the same run:
- hpcrl (hpcrl/reshard/cross_pool.py): each rollout rank receives exactly its generation shard, the
  sending spread over the training data-parallel replicas (point-to-point, batched);
- baseline, verl's one-step-off-policy recipe (verl PR #2231): training rank 0 broadcasts every full
  parameter to all rollout ranks (its gather of the full weights is NOT timed: the baseline is favoured).
Printed per pair: bytes received per rollout rank (max) vs the bound (its generation shard), the most any
training rank sent vs its even share rounded up, and the wall time (max over ranks, median of reps).

    python benchmarks/cross_pool.py [--results-dir results] [--reps 5] [--hidden 256]

Last line: `cross_pool: bytes/bound=<x> bytes/broadcast=<y> max_send/share=<z> time/broadcast=<w> at <pair>`
(goals: 1.000, 1/(t_g·p_g), <= 1.000).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.reshard import model_dims  # noqa: E402  (the same model as the colocated benchmark)
from hpcrl.bench.records import Record, write_records  # noqa: E402

# (t, p, d) -> (t_g, p_g, d_r); training ranks first, rollout ranks after them
HEADLINE = ((2, 1, 2), (2, 1, 2))
PAIRS = [
    ((2, 1, 1), (1, 1, 2)),
    ((2, 2, 1), (2, 1, 1)),
    ((1, 1, 3), (2, 1, 1)),
    ((4, 1, 1), (2, 1, 2)),
    HEADLINE,
]


def pools(pair):
    from hpcrl.distributed.layout import ParallelLayout

    (t, p, d), (t_g, p_g, d_r) = pair
    train = ParallelLayout(tensor=t, pipeline=p, data=d)
    gen = ParallelLayout(tensor=t_g, pipeline=p_g, data=d_r, rollout_tensor=t_g, rollout_pipeline=p_g)
    n = train.world_size
    return train, list(range(n)), gen, list(range(n, n + gen.world_size))


def describe(pair) -> str:
    (t, p, d), (t_g, p_g, d_r) = pair
    return f"t={t},p={p},d={d}->t_g={t_g},p_g={p_g},d_r={d_r}"


def bench_rank(rank: int, world: int, pairs: list, hidden: int, reps: int) -> list:
    import torch
    import torch.distributed as dist

    from hpcrl.distributed.groups import new_group
    from hpcrl.reshard.cross_pool import plan_cross_pool
    from hpcrl.reshard.cross_pool_transfer import FAMILY, CrossPoolTransfer
    from hpcrl.reshard.params import gpt_param_metas, shard_of
    from hpcrl.reshard.transport import CountingTransport, TorchTransport

    out = []
    for pair in pairs:
        train, train_ranks, gen, gen_ranks = pools(pair)
        metas = gpt_param_metas(model_dims(hidden), pipeline=train.pipeline)
        plan = plan_cross_pool(metas, train=train, train_ranks=train_ranks, gen=gen, gen_ranks=gen_ranks)
        transport = CountingTransport(TorchTransport())
        xfer = CrossPoolTransfer.build(plan, rank, transport)
        bcast_ranks = [0, *gen_ranks]
        bcast = new_group(bcast_ranks)  # world-collective: every rank creates it
        if xfer is None:
            out.append(None)
            continue
        torch.manual_seed(0)
        full = {m.name: torch.randn(m.shape) for m in metas}
        params, target = {}, {}
        if plan.is_sender(rank):
            tp, pp, _ = train.train_coords(rank)
            params = {
                m.name: shard_of(full[m.name], m, tp, train.tensor).clone() for m in metas if m.stage == pp
            }
        else:
            target = xfer.allocate(torch.float32)
        copies = {m.name: full[m.name].clone() for m in metas} if rank in bcast_ranks else {}
        times: dict[str, list[float]] = {"hpcrl": [], "broadcast": []}
        moved = {"hpcrl": 0, "broadcast": 0}
        for rep in range(reps + 1):  # rep 0 warms up the connections
            dist.barrier(group=xfer.group.handle)
            start = time.perf_counter()
            transport.reset()
            if plan.is_sender(rank):
                xfer.send(params)
            else:
                xfer.receive(target)
            elapsed = time.perf_counter() - start
            tally = transport.total(FAMILY)
            moved["hpcrl"] = max(tally.bytes_sent, tally.bytes_received)
            if rep:
                times["hpcrl"].append(elapsed)
            dist.barrier(group=xfer.group.handle)
            start = time.perf_counter()
            if copies:
                for tensor in copies.values():  # verl #2231: one broadcast per full parameter from rank 0
                    dist.broadcast(tensor, src=0, group=bcast)
            elapsed = time.perf_counter() - start
            moved["broadcast"] = sum(t.numel() * 4 for t in copies.values())
            if rep:
                times["broadcast"].append(elapsed)
        out.append({"moved": moved, "times": times, "bound": plan.bytes_bound(4, rank)})
    dist.barrier()
    return out


def summarize(results: list, pairs: list, hidden: int, reps: int) -> tuple[list[Record], list]:
    from hpcrl.reshard.params import gpt_param_metas

    records, rows = [], []
    for i, pair in enumerate(pairs):
        train, train_ranks, gen, gen_ranks = pools(pair)
        metas = gpt_param_metas(model_dims(hidden), pipeline=train.pipeline)
        cell = {r: results[r][i] for r in train_ranks + gen_ranks}
        received = max(cell[r]["moved"]["hpcrl"] for r in gen_ranks)
        bound = max(cell[r]["bound"] for r in gen_ranks)
        exact = all(cell[r]["moved"]["hpcrl"] == cell[r]["bound"] for r in gen_ranks)
        send_ratio = max(cell[r]["moved"]["hpcrl"] / cell[r]["bound"] for r in train_ranks)
        full = max(cell[r]["moved"]["broadcast"] for r in gen_ranks)
        by_rep = {
            kind: [
                max(rep)
                for rep in zip(*[c["times"][kind] for c in cell.values() if c["times"][kind]], strict=True)
            ]
            for kind in ("hpcrl", "broadcast")
        }
        t_x, t_b = statistics.median(by_rep["hpcrl"]), statistics.median(by_rep["broadcast"])
        common = dict(
            benchmark="cross_pool",
            baseline_name="full_weight_broadcast_from_rank0",
            repetitions=reps,
            layout=describe(pair),
            model_size=f"{sum(m.numel for m in metas) / 1e6:.1f}M params fp32",
        )
        extra = {"bound_bytes": bound, "every_receiver_exact": exact, "max_send_over_share": send_ratio}
        records += [
            Record(metric="bytes_received_per_rollout_rank", value=received, unit="B", baseline_value=full,
                   extra=extra, **common),
            Record(metric="wall_s", value=t_x, unit="s", baseline_value=t_b, samples=by_rep["hpcrl"],
                   extra={"baseline_samples": by_rep["broadcast"]}, **common),
        ]  # fmt: skip
        rows.append((describe(pair), bound, received, exact, full, send_ratio, t_x, t_b))
    return records, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", default=str(Path.cwd() / "results"))
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per transfer and pair")
    parser.add_argument("--hidden", type=int, default=256, help="model width (vocab 16x, ffn 4x, 8 layers)")
    args = parser.parse_args(argv)

    from hpcrl.distributed.spawn import run_ranks

    world = max(sum(len(r) for r in pools(p)[1::2]) for p in PAIRS)
    start = time.perf_counter()
    results = run_ranks(bench_rank, world, PAIRS, args.hidden, args.reps, timeout_s=900)
    records, rows = summarize(results, PAIRS, args.hidden, args.reps)
    print(
        f"model {records[0].model_size}, {args.reps} reps, {world} gloo ranks, {time.perf_counter() - start:.0f}s"
    )
    mb = 1 / 2**20
    print(
        f"{'pools':<34}{'bound MB':>9}{'recv MB':>9}{'exact':>6}{'bcast MB':>9}{'send/share':>11}{'time s x/bcast':>17}"
    )
    for name, bound, received, exact, full, send_ratio, t_x, t_b in rows:
        print(
            f"{name:<34}{bound * mb:>9.2f}{received * mb:>9.2f}{str(exact):>6}{full * mb:>9.2f}"
            f"{send_ratio:>11.3f}{t_x:>9.3f}/{t_b:<7.3f}"
        )
    out = write_records(args.results_dir, records)
    print(f"records: {Path(out) / 'cross_pool.jsonl'}")
    name, bound, received, _, full, send_ratio, t_x, t_b = rows[PAIRS.index(HEADLINE)]
    print(
        f"cross_pool: bytes/bound={received / bound:.3f} bytes/broadcast={received / full:.3f} "
        f"max_send/share={send_ratio:.3f} time/broadcast={t_x / t_b:.3f} at {name}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
