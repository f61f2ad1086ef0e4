"""An RL job on chat rows: prompts rendered with the chat template, the rollout writing the assistant turn."""

import json
import random
from pathlib import Path

from hpcrl.metrics.sinks import read_jsonl

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "grpo_tiny.yaml"


def test_grpo_on_messages_rows_runs_and_scores_the_assistant_turn(tmp_path):
    """`messages` rows (system + user, the answer from the assistant turn) drive a GRPO job: the prompt
    the engine sees ends with the generation prompt, and the reward compares the sampled turn with the
    row's assistant content."""
    from hpcrl import cli

    rng = random.Random(0)
    path = tmp_path / "chat.jsonl"
    with path.open("w") as fh:
        for _ in range(200):
            digits = "".join(rng.choice("0123456789") for _ in range(3))
            messages = [{"role": "system", "content": "0"}, {"role": "user", "content": f"{digits}="}]
            fh.write(json.dumps({"messages": [*messages, {"role": "assistant", "content": digits}]}) + "\n")
    overrides = {
        "data.source": "jsonl",
        "data.path": str(path),
        "data.heldout_size": 16,
        "model.vocab_size": 24,
        "data.max_prompt_length": 12,
        "reward.name": "exact_match",  # <bos> <|system|> 0 <eos> <|user|> d d d = <eos> <|assistant|>
    }
    overrides |= {"algorithm.steps": 3, "algorithm.eval_every": 3, "run_root": str(tmp_path / "runs")}
    overrides |= {"logging.tensorboard": False, "logging.progress": False}
    assert cli.main(["run", str(TEMPLATE), *[f"--{k}={v}" for k, v in overrides.items()]]) == 0
    [metrics] = list(tmp_path.glob("runs/grpo_tiny/*/metrics.jsonl"))
    rows = read_jsonl(metrics)
    assert [r["step"] for r in rows if "reward/mean" in r] == [0, 1, 2]
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows if "reward/mean" in r)
    assert "reward/heldout" in rows[-1]
