"""Rollout throughput: hpcrl's HF engine vs plain `model.generate`, same model, batch 32 (+ vLLM when present).

The engine adds what RL needs on top of `generate` (left padding of ragged prompts, log-probs of the
sampled tokens at the sampling temperature, EOS masks); the ratio says what that costs. Tokens/s counts
generated tokens (batch x new tokens, min_new_tokens forces full length so both sides do equal work).

    python benchmarks/rollout.py [--results-dir benchmarks/results] [--reps 3] [--hidden 256]

Last line: `rollout: engine/generate=<x>` (tokens/s of hpcrl's HF engine over plain generate).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.results import Record, write_records  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args(argv)

    import torch

    from hpcrl.rollout.base import SamplingParams, left_pad
    from hpcrl.rollout.hf_engine import HFRolloutEngine, build_hf_causal_lm
    from hpcrl.train.config import ModelConfig

    cfg = ModelConfig(
        vocab_size=64,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=4 * args.hidden,
        max_position_embeddings=128,
    )
    model = build_hf_causal_lm(cfg)
    params = sum(p.numel() for p in model.parameters())
    eos_id = cfg.vocab_size + 1  # never sampled: every row generates the full length on both sides
    engine = HFRolloutEngine(model, pad_id=0, eos_id=eos_id, device="cpu")
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(4, 64, (int(n),), generator=gen).tolist()
        for n in torch.randint(4, 12, (args.batch,), generator=gen)
    ]
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    ids, mask = left_pad(prompts, 0)
    tokens = args.batch * args.new_tokens

    def plain() -> None:
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                pad_token_id=0,
                eos_token_id=eos_id,
                use_cache=True,
            )

    def ours() -> None:
        out = engine.generate(prompts, sampling)
        assert out.response_ids_BT.shape == (args.batch, args.new_tokens)

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return tokens / (time.perf_counter() - start)

    ours(), plain()  # warm-up
    engine_tps, plain_tps = [], []
    for _ in range(args.reps):  # interleaved, so a load change on a shared machine hits both sides
        engine_tps.append(timed(ours))
        plain_tps.append(timed(plain))
    med_engine, med_plain = statistics.median(engine_tps), statistics.median(plain_tps)
    print(
        f"model {params / 1e6:.2f}M params, batch {args.batch} x {args.new_tokens} new tokens, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"{'engine':<28}{'tokens/s (median)':>20}")
    print(f"{'hpcrl HF engine':<28}{med_engine:>20.0f}")
    print(f"{'plain HF generate':<28}{med_plain:>20.0f}")
    from hpcrl.rollout.vllm_engine import vllm_available

    print(
        f"{'vLLM':<28}{'(not available: needs vllm + CUDA)' if not vllm_available() else 'see GPU recipe':>20}"
    )
    write_records(
        args.results_dir,
        [
            Record(
                benchmark="rollout",
                metric="tokens_per_s",
                value=med_engine,
                unit="tok/s",
                baseline_name="hf_generate",
                baseline_value=med_plain,
                repetitions=args.reps,
                samples=engine_tps,
                model_size=f"{params}",
                extra={"baseline_samples": plain_tps, "batch": args.batch, "new_tokens": args.new_tokens},
            )
        ],
    )
    print(f"rollout: engine/generate={med_engine / med_plain:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
