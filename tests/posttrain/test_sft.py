"""Supervised fine-tuning: the greedy head, teacher-forced exact match = greedy decoding's, the answer-only
batch, the stage's rules, and the tiny task learned through `hpcrl run` (at t=1 and t=2)."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from hpcrl.data.tasks import ALPHABET
from hpcrl.data.tokenizer import build_char_tokenizer
from hpcrl.distributed.spawn import run_ranks
from hpcrl.errors import ConfigError
from hpcrl.metrics.sinks import read_jsonl
from hpcrl.posttrain.sft import exact_match_B, heldout_metrics
from hpcrl.stages.sequences import response_batch
from hpcrl.stages.trainer_stage import stage_problems as sft_problems
from hpcrl.train.batch import TrainBatch
from hpcrl.train.logprobs import PolicyHead
from tests.rl._job_ranks import tiny_config

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "sft_tiny.yaml"
EOS = 2


def run_sft(rank: int, world: int, cfg, run_dir: str) -> dict:
    from hpcrl.posttrain.sft import main

    return main(cfg, Path(run_dir))


def test_the_greedy_head_marks_exactly_the_argmax_tokens():
    gen = torch.Generator().manual_seed(0)
    logits_BTV = 3 * torch.randn(4, 6, 11, generator=gen)
    ids_BT = torch.randint(0, 11, (4, 6), generator=gen)
    ids_BT[:, 1:][0] = logits_BTV[0, :-1].argmax(-1)  # row 0: every token the argmax
    out = PolicyHead(None, 0, greedy=True)(logits_BTV, ids_BT)
    expected = (logits_BTV[:, :-1].argmax(-1) == ids_BT[:, 1:]).float()
    assert torch.equal(out.greedy_BT[:, 1:], expected) and out.greedy_BT[0, 1:].all()
    assert (
        "greedy_BT" not in PolicyHead(None, 0).keys
        and PolicyHead(None, 0)(logits_BTV, ids_BT).greedy_BT is None
    )


def _bigram_greedy(table_VV: torch.Tensor, prompt: list[int], limit: int = 12) -> list[int] | None:
    """Greedy decoding of the bigram model `table[previous token] -> logits` until <eos> (None: never)."""
    out = []
    while len(out) < limit:
        out.append(int(table_VV[(out or prompt)[-1]].argmax()))
        if out[-1] == EOS:
            return out
    return None


def test_teacher_forced_exact_match_is_what_greedy_decoding_gives():
    """On a bigram model: the row holding greedy decoding's own answer (<eos> included) is an exact match;
    the same row with any one answer token changed is not, wherever the change is."""
    vocab = 9
    for seed in range(200):
        table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed))
        prompt = [1, 5, 7]
        answer = _bigram_greedy(table, prompt)
        if answer is not None and len(answer) >= 3:
            break
    else:
        raise AssertionError("no seed made a bigram model that stops")
    rows = [prompt + answer]
    for position in range(len(answer)):
        changed = list(answer)
        changed[position] = (changed[position] + 1) % vocab
        rows.append(prompt + changed)
    ids_BT = torch.tensor(rows)
    response_BT = torch.zeros_like(ids_BT, dtype=torch.bool)
    response_BT[:, len(prompt) :] = True
    logits_BTV = table[ids_BT]  # the logits after each token
    out = PolicyHead(None, 0, greedy=True)(logits_BTV, ids_BT)
    assert exact_match_B(out.greedy_BT, response_BT).tolist() == [True] + [False] * len(answer)
    batch = TrainBatch(ids_BT, torch.ones_like(response_BT), response_BT)
    assert heldout_metrics(out, batch)["sft/heldout_exact_match"] == pytest.approx(1 / len(rows))


def test_the_batch_counts_answer_and_eos_tokens_only():
    tok = build_char_tokenizer(ALPHABET, 16)
    batch = response_batch(["12=", "345="], ["21", "543"], tok, max_prompt_length=8, context=32)
    assert batch.response_mask_BT.sum(dim=1).tolist() == [3, 4]
    assert tok.decode(batch.input_ids_BT[1][batch.response_mask_BT[1]]) == "543<eos>"
    assert not batch.response_mask_BT[:, :4].any()
    with pytest.raises(ConfigError, match="model.max_position_embeddings"):
        response_batch(["345="], ["543"], tok, max_prompt_length=8, context=8)


def test_sft_rules_and_rows_without_answers_are_config_errors(tmp_path):
    cfg = tiny_config(TEMPLATE)
    bad = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, examples_per_step=1, eval_every=-1))
    bad = dataclasses.replace(bad, parallel=dataclasses.replace(bad.parallel, data=2))
    assert {p.key for p in sft_problems(bad, world_size=2)} == {"sft.eval_every"}  # a range: alone
    bad = dataclasses.replace(bad, sft=dataclasses.replace(bad.sft, eval_every=0))
    assert {p.key for p in sft_problems(bad, world_size=2)} == {"sft.examples_per_step"}
    assert sft_problems(cfg, world_size=1) == []
    rows = tmp_path / "prompts.jsonl"
    rows.write_text("\n".join(json.dumps({"prompt": f"{i}="}) for i in range(8)))
    with pytest.raises(ConfigError) as err:  # found at expand, before any rank (issue 43)
        tiny_config(TEMPLATE, **{"data.source": "jsonl", "data.path": str(rows), "data.heldout_size": 2})
    assert [p.key for p in err.value.problems] == ["data.answer_key"]
    assert f"{rows}: row 0, 1, 2, 3, 4 and 3 more has nothing to learn" in err.value.problems[0].message


def _generated_exact_match(checkpoint: Path, out_dir: Path, cfg) -> float:
    """Export the checkpoint to HF, greedy-decode every held-out prompt with transformers' generate, and
    return the share of answers reproduced exactly (then <eos>)."""
    from transformers import AutoModelForCausalLM

    from hpcrl.ckpt.export import export_hf
    from hpcrl.data.sources import load_splits
    from hpcrl.data.tokenizer import encode_prompts

    model = AutoModelForCausalLM.from_pretrained(export_hf(checkpoint, out_dir), attn_implementation="eager")
    tok = build_char_tokenizer(ALPHABET, cfg.model.vocab_size)
    _, heldout = load_splits(cfg.data, None)
    hits = 0
    for row, prompt in zip(heldout, encode_prompts(tok, [r.prompt for r in heldout], 8), strict=True):
        out = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=6, eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )  # fmt: skip
        hits += out[0, len(prompt) :].tolist() == tok(row.answer, add_special_tokens=False)["input_ids"] + [
            tok.eos_token_id
        ]
    return hits / len(heldout)


@pytest.mark.heavy
@pytest.mark.dist
def test_hpcrl_run_sft_tiny_learns_the_task_to_exact_match(tmp_path, capsys):
    """`hpcrl run templates/sft_tiny.yaml` (stage sft), 60 steps: held-out greedy exact match 0 -> >= 0.9;
    its final checkpoint, exported to HF and decoded by transformers' greedy `generate`, reproduces the
    same share of held-out answers as the teacher-forced metric says."""
    from hpcrl import cli

    overrides = {
        "sft.steps": 60,
        "run_root": str(tmp_path),
        "logging.tensorboard": False,
        "logging.progress": False,
    }
    assert cli.main(["run", str(TEMPLATE), *[f"--{k}={v}" for k, v in overrides.items()]]) == 0
    [metrics] = list(tmp_path.glob("sft_tiny/*/metrics.jsonl"))
    rows = read_jsonl(metrics)
    held = [(r["step"], r["sft/heldout_exact_match"]) for r in rows if "sft/heldout_exact_match" in r]
    assert [s for s, _ in held] == list(range(0, 61, 10))
    assert held[0][1] == 0.0 and held[-1][1] >= 0.9, held
    assert rows[59]["sft/loss"] < rows[0]["sft/loss"] / 4 and rows[59]["sft/token_accuracy"] > 0.9
    assert not any(key.startswith("reward/") for row in rows for key in row)
    assert (metrics.parent / "accuracy.png").exists()
    cfg = tiny_config(TEMPLATE)
    final = metrics.parent / "checkpoints" / "step_00000060"
    assert _generated_exact_match(final, tmp_path / "hf", cfg) == rows[-1]["sft/heldout_exact_match"]


@pytest.mark.heavy
@pytest.mark.dist
@pytest.mark.slow
def test_sft_tensor_parallel_2_matches_one_rank(tmp_path):
    """t=2 (vocab-parallel log-probs and argmax) gives t=1's losses and accuracies (fp32, sums only)."""
    common = {"sft.steps": 3, "sft.eval_every": 1, "sft.examples_per_step": 16, "optim.micro_batch_size": 16}
    cfg1 = tiny_config(TEMPLATE, **common)
    cfg2 = tiny_config(TEMPLATE, **common, **{"parallel.tensor": 2, "cluster.tasks_per_node": 2})
    run_ranks(run_sft, 1, cfg1, str(tmp_path / "t1"), timeout_s=300)
    run_ranks(run_sft, 2, cfg2, str(tmp_path / "t2"), timeout_s=300)
    one, two = read_jsonl(tmp_path / "t1" / "metrics.jsonl"), read_jsonl(tmp_path / "t2" / "metrics.jsonl")
    assert len(one) == len(two) == 4
    for a, b in zip(one, two, strict=True):
        for key in ("sft/heldout_loss", "sft/loss", "sft/token_accuracy"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5), key
        assert b.get("sft/heldout_exact_match") == a.get("sft/heldout_exact_match")


@pytest.mark.heavy
def test_hpcrl_run_sft_on_multi_turn_chat_rows_learns_every_assistant_turn(tmp_path):
    """Chat rows (`messages`: system, two user/assistant exchanges, a trailing tool turn) through the tiny
    tokenizer's chat template, the loss on assistant turns only: the held-out exact match (both assistant
    turns greedy-correct given the history) goes from 0 to >= 0.9 in sft_tiny's 150 steps."""
    import random

    from hpcrl import cli

    rng = random.Random(0)
    path = tmp_path / "chat.jsonl"
    with path.open("w") as fh:
        for _ in range(600):
            messages = [{"role": "system", "content": "0"}]
            for digits in ("".join(rng.choice("0123456789") for _ in range(3)) for _ in range(2)):
                messages += [
                    {"role": "user", "content": f"{digits}="},
                    {"role": "assistant", "content": digits[::-1]},
                ]
            fh.write(json.dumps({"messages": [*messages, {"role": "tool", "content": "9"}]}) + "\n")
    overrides = {
        "data.source": "jsonl",
        "data.path": str(path),
        "data.heldout_size": 64,
        "model.vocab_size": 24,
    }
    overrides |= {"run_root": str(tmp_path / "runs"), "logging.tensorboard": False, "logging.progress": False}
    assert cli.main(["run", str(TEMPLATE), *[f"--{k}={v}" for k, v in overrides.items()]]) == 0
    [metrics] = list(tmp_path.glob("runs/sft_tiny/*/metrics.jsonl"))
    held = [r["sft/heldout_exact_match"] for r in read_jsonl(metrics) if "sft/heldout_exact_match" in r]
    assert held[0] == 0.0 and held[-1] >= 0.9, held
