"""Real lengths (issue 25): training and rollout on the long-tailed task, today's padded path vs the new one,
same model, same batch, one run.

    python benchmarks/lengths.py [--results-dir results] [--batch 128] [--hidden 256] [--reps 3]

Batch: `--batch` rows of the built-in `long_tail` task (prompts of 4..48 tokens, answers of 1..96
characters drawn geometric with mean 16, + EOS), tokenized as the RL job does, 8 rows per prompt as a
GRPO step holds them (templates/grpo_long_tail.yaml: 16 prompts x 8); the response is the answer, so the
lengths are the task's.

Train (2 gloo DP ranks, one update of the whole batch, lr 0 so every repetition sees the same weights):
- padded: `micro_batch_size` rows per micro-batch, each rank its contiguous half, rows padded to the
  batch's longest;
- new: `pack_sequences` + `max_tokens_per_micro_batch` = the padded micro-batch's tokens (the same
  activation budget) + `balance_dp_tokens`.
Tokens/s = real (non-padding) prompt + response tokens of the batch / update seconds (median of `--reps`,
the two paths alternated). padding = 1 - real / computed tokens (the trainer's `padding_fraction`);
dp_imbalance = max / mean real tokens per DP rank (contiguous halves vs the balanced partition).

Rollout (1 rank, hpcrl's megatron engine at t_g = 1, random weights: with a 16-token vocabulary the
per-step EOS chance is ~1/16, so response lengths are geometric with mean ~16, the task's shape): the
same prompts and per-row seeds, one padded prefill and every row decoded until the last one finishes
(static batch) vs prefill in length buckets and rows leaving at EOS (`ragged`); and with
`--max-num-seqs` rows at once (rollout.max_num_seqs), static waves of that many rows (what the RL job ran
before) vs continuous batching (a finished row's slot taken by a waiting prompt). All produce the same
samples (checked); tokens/s = generated tokens / generate seconds. The line before the last:
`lengths: rollout at max_num_seqs=<n>: continuous/waves tokens/s ratio=<z>`.

Last line: `lengths: train tokens/s ratio=<x> padding=<before>-><after> dp_imbalance=<before>-><after>
rollout tokens/s ratio=<y>`; records go to <results-dir>/lengths.jsonl.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VOCAB = 16  # the tiny char tokenizer's (templates/tiny.yaml)
MAX_NEW_TOKENS = 96
SAMPLES = 8
"""Samples per prompt (a GRPO group: the same prompt, so the same target length, in adjacent rows)."""


def model_config(hidden: int, layers: int):
    from hpcrl.train.config import ModelConfig

    return ModelConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=4,
        num_query_groups=4,
        ffn_hidden_size=4 * hidden,
        max_position_embeddings=160,
    )


def long_tail_batch(batch: int, seed: int = 0):
    """(TrainBatch of prompt + answer + EOS rows, the prompts' token ids): batch / SAMPLES prompts, each
    SAMPLES times in a row, as a GRPO step lays out its groups (templates/grpo_long_tail.yaml: 16 x 8);
    prompts left padded, responses right padded (the RL job's layout)."""
    import torch

    from hpcrl.data.tasks import get_task, make_splits
    from hpcrl.data.tokenizer import encode_prompts, model_tokenizer
    from hpcrl.rollout.base import left_pad
    from hpcrl.train.batch import TrainBatch

    tokenizer = model_tokenizer(None, VOCAB)
    distinct, _ = make_splits(get_task("long_tail"), 16, max(1, batch // SAMPLES), 1, seed)
    examples = [e for e in distinct for _ in range(SAMPLES)][:batch]
    prompts = encode_prompts(tokenizer, [e.prompt for e in examples], 49)
    answers = [
        tokenizer(e.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for e in examples
    ]
    prompt_BP, keep_BP = left_pad(prompts, tokenizer.pad_token_id)
    R = max(len(a) for a in answers)
    response_BR = torch.full((batch, R), tokenizer.pad_token_id, dtype=torch.long)
    mask_BR = torch.zeros(batch, R, dtype=torch.bool)
    for b, answer in enumerate(answers):
        response_BR[b, : len(answer)] = torch.tensor(answer)
        mask_BR[b, : len(answer)] = True
    ids = torch.cat([prompt_BP, response_BR], dim=1)
    attention = torch.cat([keep_BP.bool(), mask_BR], dim=1)
    response = torch.cat([torch.zeros_like(keep_BP, dtype=torch.bool), mask_BR], dim=1)
    gen = torch.Generator().manual_seed(seed)
    extras = {"advantages_BT": torch.randn(ids.shape, generator=gen) * response}
    return TrainBatch(ids, attention, response, extras=extras), prompts


def _loss(outputs, mb):
    return mb.token_mean(-outputs.logprobs_BT * mb.extras["advantages_BT"]), {}


def train_rank(
    rank: int, world: int, hidden: int, layers: int, batch_size: int, micro: int, reps: int
) -> dict:
    """Update seconds of the padded and the new path, alternated, on 2 DP ranks."""
    from hpcrl.train.config import OptimizerConfig
    from hpcrl.train.model import build_train_groups
    from hpcrl.train.token_budget import imbalance
    from hpcrl.train.trainer import build_policy_trainer
    from hpcrl.train.workers import TrainerWorker

    groups = build_train_groups(1, 1, world)
    cfg = model_config(hidden, layers)
    batch, _ = long_tail_batch(batch_size)
    width = batch.input_ids_BT.shape[1]
    paths = {
        "padded": (OptimizerConfig(lr=0.0, micro_batch_size=micro), False),
        "new": (
            OptimizerConfig(
                lr=0.0, micro_batch_size=micro, pack_sequences=True, max_tokens_per_micro_batch=micro * width
            ),
            True,
        ),
    }
    workers = {
        name: TrainerWorker(build_policy_trainer(cfg, optim, groups), micro, balance_tokens=balance)
        for name, (optim, balance) in paths.items()
    }
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    stats = {}
    for rep in range(reps + 1):  # the first round warms up
        for name, worker in workers.items():
            start = time.perf_counter()
            stats[name] = worker.update(batch, _loss)
            if rep:
                seconds[name].append(time.perf_counter() - start)
    lengths = batch.row_lengths()
    half = len(lengths) // world
    contiguous = [list(range(r * half, (r + 1) * half)) for r in range(world)]
    return {
        "seconds": seconds,
        "real_tokens": sum(lengths),
        "padding": {name: stats[name]["padding_fraction"] for name in paths},
        "dp_imbalance": {"padded": imbalance(lengths, contiguous), "new": stats["new"]["dp/token_imbalance"]},
    }


def rollout_rank(
    rank: int, world: int, hidden: int, layers: int, batch_size: int, at_once: int, reps: int
) -> dict:
    """Generate seconds of the static and the ragged decode, and of static waves and continuous batching
    at `at_once` rows (rollout.max_num_seqs), on the same weights, prompts and seeds."""
    import torch

    from hpcrl.rollout.base import SamplingParams, row_seeds
    from hpcrl.rollout.megatron_engine import MegatronRolloutEngine
    from hpcrl.rows import concat_rows, pad_columns
    from hpcrl.train.model import build_gpt_model, build_train_groups

    groups = build_train_groups(1, 1, 1)
    cfg = model_config(hidden, layers)
    _, prompts = long_tail_batch(batch_size)
    model = build_gpt_model(cfg, groups)
    pad, eos = 0, 2  # the char tokenizer's <pad> and </s> (hpcrl.data.tokenizer.SPECIAL_TOKENS)
    static = MegatronRolloutEngine(model, cfg, groups, pad, eos, ragged=False)
    ragged = MegatronRolloutEngine(model, cfg, groups, pad, eos)
    continuous = MegatronRolloutEngine(model, cfg, groups, pad, eos, max_rows=at_once)
    sampling = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=1.0)
    seeds = row_seeds(7, 0, len(prompts))
    # what RolloutWorker did with rollout.max_num_seqs before: static waves of `at_once` rows
    waves = [(a, min(a + at_once, len(prompts))) for a in range(0, len(prompts), at_once)]
    runs = {
        "static": lambda: static.generate(prompts, sampling, seeds),
        "ragged": lambda: ragged.generate(prompts, sampling, seeds),
        "waves": lambda: concat_rows(
            [
                pad_columns(
                    static.generate(prompts[a:b], sampling, seeds[a:b]),
                    MAX_NEW_TOKENS,
                    {"response_ids_BT": pad},
                )
                for a, b in waves
            ]
        ),
        "continuous": lambda: continuous.generate(prompts, sampling, seeds),
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    outputs = {}
    for rep in range(reps + 1):
        for name, run in runs.items():
            start = time.perf_counter()
            outputs[name] = run()
            if rep:
                seconds[name].append(time.perf_counter() - start)
    same = all(
        torch.equal(outputs["static"].response_ids_BT, out.response_ids_BT) for out in outputs.values()
    )
    lengths = outputs["ragged"].response_mask_BT.sum(dim=1)
    return {
        "seconds": seconds,
        "generated_tokens": int(lengths.sum()),
        "same_samples": same,
        "longest": int(lengths.max()),
        "mean": float(lengths.float().mean()),
    }


def _record(metric, tps, new, old, baseline, seconds, tokens, reps, layout, size) -> dict:
    """A lengths record's fields: `new`'s tokens/s against `old`'s, each repetition's as a sample."""
    return {
        "benchmark": "lengths",
        "metric": metric,
        "value": tps[new],
        "unit": "tok/s",
        "baseline_name": baseline,
        "baseline_value": tps[old],
        "repetitions": reps,
        "samples": [tokens / s for s in seconds[new]],
        "layout": layout,
        "model_size": size,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", default=str(Path.cwd() / "results"))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=16, help="padded rows per micro-batch")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-num-seqs", type=int, default=16, help="rows at once: waves vs continuous")
    args = parser.parse_args(argv)

    from hpcrl.bench.records import Record, write_records
    from hpcrl.distributed.spawn import run_ranks

    shape = (args.hidden, args.layers)
    train = run_ranks(train_rank, 2, *shape, args.batch, args.micro_batch, args.reps, timeout_s=1800)[0]
    rollout = run_ranks(rollout_rank, 1, *shape, args.batch, args.max_num_seqs, args.reps, timeout_s=1800)[0]
    if not rollout["same_samples"]:
        raise SystemExit("lengths: the ragged decode sampled other tokens than the static batch")
    train_tps = {k: train["real_tokens"] / statistics.median(v) for k, v in train["seconds"].items()}
    gen_tps = {k: rollout["generated_tokens"] / statistics.median(v) for k, v in rollout["seconds"].items()}
    size, reps = f"h={args.hidden},L={args.layers}", args.reps
    records = [
        _record(
            "train_tokens_per_s",
            train_tps,
            "new",
            "padded",
            "padded_rows",
            train["seconds"],
            train["real_tokens"],
            reps,
            "d=2",
            size,
        )
        | {
            "extra": {"padding": train["padding"], "dp_imbalance": train["dp_imbalance"], "batch": args.batch}
        },
        _record(
            "rollout_tokens_per_s",
            gen_tps,
            "ragged",
            "static",
            "static_batch",
            rollout["seconds"],
            rollout["generated_tokens"],
            reps,
            "t_g=1",
            size,
        )
        | {"extra": {k: rollout[k] for k in ("generated_tokens", "longest", "mean")} | {"batch": args.batch}},
    ]
    records.append(
        _record(
            "rollout_tokens_per_s_capped",
            gen_tps,
            "continuous",
            "waves",
            "static_waves",
            rollout["seconds"],
            rollout["generated_tokens"],
            reps,
            "t_g=1",
            size,
        )
        | {"extra": {"max_num_seqs": args.max_num_seqs, "batch": args.batch}}
    )
    write_records(Path(args.results_dir), [Record(**fields) for fields in records])
    pad, imb = train["padding"], train["dp_imbalance"]
    print(
        f"lengths: rollout at max_num_seqs={args.max_num_seqs}: continuous/waves tokens/s "
        f"ratio={gen_tps['continuous'] / gen_tps['waves']:.2f}"
    )
    print(
        f"lengths: train tokens/s ratio={train_tps['new'] / train_tps['padded']:.2f} "
        f"padding={pad['padded']:.1%}->{pad['new']:.1%} "
        f"dp_imbalance={imb['padded']:.3f}->{imb['new']:.3f} "
        f"rollout tokens/s ratio={gen_tps['ragged'] / gen_tps['static']:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
