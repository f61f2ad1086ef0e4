"""Train -> rollout resharding: HybridFlow's micro-DP all-gather vs the naive TP gather + PP broadcast.

For a table of layout pairs (up to 8 spawned gloo ranks, one spawn for the whole table), both engines run
on the same model in the same run: bytes received per rank and collectives (from the counting transport),
peak extra memory (engine buffer accounting), wall time of `to_generation` (max over ranks, median over
repetitions). The bound is HybridFlow Table 2's (d_g−1)/(t·p)·M_split per rank; the naive figure is
(t·p−1)/(t·p)·M_split. Bytes compared are the TP-split parameters' (norms travel separately, on the
stage-merge group, and are listed in the `norm B` column).

    python benchmarks/reshard.py [--results-dir results] [--reps 3] [--hidden 256]

Last line: `reshard: bytes/bound=<x> bytes/naive=<y> time/naive=<z> at t=4,p=2->t_g=2,p_g=1`
(goals: 1.000, <= 0.43, <= 0.6).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpcrl.bench.records import Record, write_records  # noqa: E402

HEADLINE = (4, 2, 1, 2, 1)
PAIRS = [
    (2, 1, 1, 1, 1),
    (4, 1, 1, 2, 1),
    (4, 1, 1, 1, 1),
    (1, 2, 1, 1, 1),
    (2, 2, 1, 1, 1),
    (2, 2, 2, 1, 1),
    (8, 1, 1, 4, 1),
    (4, 2, 1, 2, 2),
    HEADLINE,
]


def model_dims(hidden: int) -> SimpleNamespace:
    """Llama-like GQA proportions; 8 layers so every table layout splits it."""
    return SimpleNamespace(
        vocab_size=16 * hidden,
        hidden_size=hidden,
        num_layers=8,
        num_attention_heads=8,
        num_query_groups=8,
        ffn_hidden_size=4 * hidden,
        qkv_bias=False,
        tie_word_embeddings=False,
    )


def _layout(pair):
    from hpcrl.distributed.layout import ParallelLayout

    t, p, d, t_g, p_g = pair
    return ParallelLayout(tensor=t, pipeline=p, data=d, rollout_tensor=t_g, rollout_pipeline=p_g)


def _timed_reshard(engine, group_barrier) -> float:
    group_barrier()
    start = time.perf_counter()
    shard = engine.to_generation()
    elapsed = time.perf_counter() - start
    engine.to_training(shard)
    return elapsed


def bench_rank(rank: int, world_size: int, pairs: list, hidden: int, reps: int, bucket_bytes: int) -> list:
    import torch
    import torch.distributed as dist

    from hpcrl.reshard.build import ENGINE_FAMILIES
    from hpcrl.reshard.engine import HybridEngine
    from hpcrl.reshard.naive import NaiveEngine
    from hpcrl.reshard.params import gpt_param_metas, shard_of
    from hpcrl.reshard.planner import SPLIT, plan_rank
    from hpcrl.reshard.transport import CountingTransport, TorchTransport, make_groups

    dims = model_dims(hidden)
    cache: dict = {}
    out = []
    for pair in pairs:
        layout = _layout(pair)
        groups = make_groups(layout, ENGINE_FAMILIES, cache=cache)
        block_key = ("block", layout.world_size)
        if block_key not in cache:  # same decision on every rank: new_group is world-collective
            cache[block_key] = dist.new_group(list(range(layout.world_size)))
        if rank >= layout.world_size:
            out.append(None)
            continue
        block = cache[block_key]
        metas = gpt_param_metas(dims, pipeline=layout.pipeline)
        tp, pp, _ = layout.train_coords(rank)
        params = {
            m.name: shard_of(torch.randn(m.shape), m, tp, layout.tensor).clone()
            for m in metas
            if m.stage == pp
        }
        plan = plan_rank(layout, metas, rank, bucket_bytes=bucket_bytes)
        engines, transports = {}, {}
        for kind in ("hybrid", "naive"):
            transports[kind] = CountingTransport(TorchTransport())
            engines[kind] = (
                HybridEngine(plan, transports[kind], groups)
                if kind == "hybrid"
                else NaiveEngine(plan, metas, transports[kind], groups)
            )
            engines[kind].attach(dict(params))
        times: dict[str, list[float]] = {"hybrid": [], "naive": []}
        for rep in range(reps + 1):  # rep 0 warms up gloo connections; engines alternate against load drift
            for kind, engine in engines.items():
                transports[kind].reset()
                elapsed = _timed_reshard(engine, lambda g=block: dist.barrier(group=g))
                if rep:
                    times[kind].append(elapsed)
        row = {}
        for kind, transport in transports.items():
            split, total = transport.total(SPLIT), transport.total()
            row[kind] = {
                "split_bytes": split.bytes_received,
                "total_bytes": total.bytes_received,
                "calls": total.calls,
                "peak": engines[kind].meter.peak,
                "times": times[kind],
            }
        out.append(row)
        del params
    return out


def summarize(
    results: list, pairs: list, hidden: int, reps: int, bucket_bytes: int
) -> tuple[list[Record], list]:
    from hpcrl.reshard.params import gpt_param_metas, split_bytes_per_rank

    records, rows = [], []
    dims = model_dims(hidden)
    for i, pair in enumerate(pairs):
        layout = _layout(pair)
        metas = gpt_param_metas(dims, pipeline=layout.pipeline)
        per_rank = split_bytes_per_rank(metas, layout.tensor, layout.pipeline)
        m_split = per_rank * layout.model_parallel_size
        bound = (layout.micro_data - 1) * per_rank
        naive_formula = (layout.model_parallel_size - 1) * per_rank
        ranks = [results[r][i] for r in range(layout.world_size)]
        agg = {}
        for kind in ("hybrid", "naive"):
            split = [r[kind]["split_bytes"] for r in ranks]
            times_by_rep = list(zip(*[r[kind]["times"] for r in ranks], strict=True))
            agg[kind] = {
                "split": max(split),
                "split_equal": len(set(split)) == 1,
                "total": max(r[kind]["total_bytes"] for r in ranks),
                "calls": max(r[kind]["calls"] for r in ranks),
                "peak": max(r[kind]["peak"] for r in ranks),
                "times": [max(rep) for rep in times_by_rep],
            }
        h, n = agg["hybrid"], agg["naive"]
        t_h, t_n = statistics.median(h["times"]), statistics.median(n["times"])
        name = layout.describe().replace(",d=1", "")
        extra = {
            "bound_bytes": bound,
            "naive_formula_bytes": naive_formula,
            "m_split_bytes": m_split,
            "bucket_bytes": bucket_bytes,
            "world": layout.world_size,
        }
        common = dict(
            benchmark="reshard",
            baseline_name="naive_tp_gather_pp_broadcast",
            repetitions=reps,
            layout=name,
            model_size=f"{sum(m.numel for m in metas) / 1e6:.1f}M params fp32",
        )
        records += [
            Record(
                metric="bytes_received_per_rank",
                value=h["split"],
                unit="B",
                baseline_value=n["split"],
                extra={
                    **extra,
                    "same_on_every_rank": h["split_equal"] and n["split_equal"],
                    "ratio_to_bound": h["split"] / bound if bound else 1.0,
                    "naive_ratio_to_formula": n["split"] / naive_formula if naive_formula else 1.0,
                },
                **common,
            ),
            Record(
                metric="collectives_per_rank",
                value=h["calls"],
                unit="calls",
                baseline_value=n["calls"],
                extra=extra,
                **common,
            ),
            Record(
                metric="peak_extra_bytes_per_rank",
                value=h["peak"],
                unit="B",
                baseline_value=n["peak"],
                extra=extra,
                **common,
            ),
            Record(
                metric="wall_s",
                value=t_h,
                unit="s",
                baseline_value=t_n,
                samples=h["times"],
                extra={**extra, "baseline_samples": n["times"]},
                **common,
            ),
        ]
        rows.append((name, layout.micro_data, bound, h, n, t_h, t_n))
    return records, rows


def print_table(rows: list) -> None:
    mb = 1 / 2**20
    print(
        f"{'layout':<24}{'d_g':>4}{'bound MB':>10}{'hybrid MB':>10}{'naive MB':>10}{'h/bound':>9}{'h/naive':>9}"
        f"{'norm B':>8}{'calls h/n':>11}{'peak MB h/n':>14}{'time s h/n':>16}{'t h/n':>7}"
    )
    for name, d_g, bound, h, n, t_h, t_n in rows:
        ratio_bound = h["split"] / bound if bound else 1.0
        ratio_naive = h["split"] / n["split"] if n["split"] else float("nan")
        print(
            f"{name:<24}{d_g:>4}{bound * mb:>10.2f}{h['split'] * mb:>10.2f}{n['split'] * mb:>10.2f}"
            f"{ratio_bound:>9.3f}{ratio_naive:>9.3f}{h['total'] - h['split']:>8}"
            f"{h['calls']:>5}/{n['calls']:<5}{h['peak'] * mb:>7.1f}/{n['peak'] * mb:<6.1f}"
            f"{t_h:>8.3f}/{t_n:<7.3f}{t_h / t_n if t_n else float('nan'):>7.2f}"
        )


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r[0] for r in rows]
    xs = range(len(rows))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    w = 0.27
    ax1.bar([x - w for x in xs], [r[2] / 2**20 for r in rows], w, label="bound (d_g−1)/(tp)·M")
    ax1.bar(list(xs), [r[3]["split"] / 2**20 for r in rows], w, label="HybridFlow engine")
    ax1.bar([x + w for x in xs], [r[4]["split"] / 2**20 for r in rows], w, label="naive gather")
    ax1.set_ylabel("MB received per rank")
    ax1.legend()
    ax2.bar([x - w / 2 for x in xs], [r[5] for r in rows], w, label="HybridFlow engine", color="C1")
    ax2.bar([x + w / 2 for x in xs], [r[6] for r in rows], w, label="naive gather", color="C2")
    ax2.set_ylabel("wall s (train -> rollout)")
    ax2.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
    ax2.legend()
    fig.suptitle("hpcrl reshard: bytes and time per layout pair (gloo, spawned ranks)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", default=str(Path.cwd() / "results"))
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per engine and pair")
    parser.add_argument("--hidden", type=int, default=256, help="model width (vocab 16x, ffn 4x, 8 layers)")
    parser.add_argument("--bucket-mb", type=float, default=4.0, help="all-gather bucket (staging) size")
    parser.add_argument("--pairs", default="all", help="'headline' runs only t=4,p=2->t_g=2,p_g=1")
    args = parser.parse_args(argv)

    from hpcrl.distributed.spawn import run_ranks

    pairs = [HEADLINE] if args.pairs == "headline" else PAIRS
    bucket_bytes = int(args.bucket_mb * 2**20)
    world = max(_layout(p).world_size for p in pairs)
    start = time.perf_counter()
    results = run_ranks(bench_rank, world, pairs, args.hidden, args.reps, bucket_bytes, timeout_s=900)
    records, rows = summarize(results, pairs, args.hidden, args.reps, bucket_bytes)
    print(
        f"model {records[0].model_size}, bucket {args.bucket_mb:g} MB, {args.reps} reps, "
        f"{world} gloo ranks, {time.perf_counter() - start:.0f}s"
    )
    print_table(rows)
    out = write_records(args.results_dir, records)
    plot(rows, Path(out) / "reshard.png")
    print(f"records: {Path(out) / 'reshard.jsonl'}  plot: {Path(out) / 'reshard.png'}")
    _, _, bound, h, n, t_h, t_n = rows[pairs.index(HEADLINE)]
    print(
        f"reshard: bytes/bound={h['split'] / bound:.3f} bytes/naive={h['split'] / n['split']:.3f} "
        f"time/naive={t_h / t_n:.3f} at t=4,p=2->t_g=2,p_g=1"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
