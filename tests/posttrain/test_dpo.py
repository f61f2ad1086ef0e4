"""Offline DPO: preference data, the pair batch, config rules, and the toy task learning its preference."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from hpcrl.data.preference import load_preference_splits, read_preference_jsonl, toy_pairs
from hpcrl.data.tasks import Example
from hpcrl.distributed.spawn import run_ranks
from hpcrl.errors import ConfigError
from hpcrl.metrics.sinks import read_jsonl
from hpcrl.posttrain.preference_setup import pair_batch
from hpcrl.stages.trainer_stage import stage_problems as dpo_problems
from tests.rl._job_ranks import tiny_config

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "dpo_tiny.yaml"


def run_dpo(rank: int, world: int, cfg, run_dir: str) -> dict:
    from hpcrl.posttrain.dpo import main

    return main(cfg, Path(run_dir))


def _tokenizer():
    from hpcrl.data.tasks import ALPHABET
    from hpcrl.data.tokenizer import build_char_tokenizer

    return build_char_tokenizer(ALPHABET, 16)


def test_toy_pairs_prefer_the_exact_answer_over_a_wrong_one_of_equal_length():
    pairs = toy_pairs([Example("412=", "412"), Example("7=", "7")] * 20, seed=0)
    assert all(p.chosen in ("412", "7") and p.rejected != p.chosen for p in pairs)
    assert all(len(p.rejected) == len(p.chosen) and p.rejected.isdigit() for p in pairs)


def test_pair_batch_keeps_each_pair_adjacent_and_masks_only_responses():
    tok = _tokenizer()
    pairs = toy_pairs([Example("12=", "12"), Example("345=", "345")], seed=1)
    batch = pair_batch(pairs, tok, max_prompt_length=8, context=32)
    # <bos> 1 2 = | chosen 1 2 <eos> ; rejected ?? <eos>; the second pair is one token longer
    assert batch.input_ids_BT.shape == (4, 9)
    assert batch.response_mask_BT.sum(dim=1).tolist() == [3, 3, 4, 4]
    assert tok.decode(batch.input_ids_BT[0][batch.response_mask_BT[0]]) == "12<eos>"
    assert tok.decode(batch.input_ids_BT[2][batch.attention_mask_BT[2]]) == "<bos>345=345<eos>"
    assert not batch.response_mask_BT[:, :4].any()  # prompt tokens never count in the loss
    with pytest.raises(ConfigError, match="model.max_position_embeddings"):
        pair_batch(pairs, tok, max_prompt_length=8, context=8)


def test_preference_jsonl_splits_and_names_a_missing_key(tmp_path):
    good = tmp_path / "prefs.jsonl"
    rows = [{"prompt": f"{i}=", "chosen": str(i), "rejected": str(i + 1)} for i in range(10)]
    good.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = tiny_config(TEMPLATE, **{"data.source": "jsonl", "data.path": str(good), "data.heldout_size": 2})
    train, heldout = load_preference_splits(cfg.data, _tokenizer())
    assert len(train) == 8 and heldout[-1].prompt == "9=" and heldout[-1].rejected == "10"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "1=", "chosen": "1"}) + "\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl.*row 0 has no \['rejected'\]"):
        read_preference_jsonl(bad)


def test_dpo_config_rules_report_every_problem():
    """The ranks check again what expand/submit checked (dpo.beta and an odd micro-batch are refused
    there already, so they are set here behind the resolver's back, as a config from elsewhere could be)."""
    cfg = tiny_config(TEMPLATE)
    cfg = dataclasses.replace(
        cfg,
        dpo=dataclasses.replace(cfg.dpo, beta=0.0),
        optim=dataclasses.replace(cfg.optim, micro_batch_size=7),
    )
    keys = {p.key for p in dpo_problems(cfg, world_size=2)}
    assert keys == {"dpo.beta", "parallel"}  # a number out of its range is reported before the rules
    cfg = dataclasses.replace(cfg, dpo=dataclasses.replace(cfg.dpo, beta=0.1))
    assert {p.key for p in dpo_problems(cfg, world_size=2)} == {"optim.micro_batch_size", "parallel"}
    assert dpo_problems(tiny_config(TEMPLATE), world_size=1) == []


@pytest.mark.dist
def test_hpcrl_run_dpo_tiny_heldout_accuracy_and_margin_rise(tmp_path, capsys):
    """`hpcrl run templates/dpo_tiny.yaml` (stage dpo: its entrypoint hpcrl.posttrain.dpo:main), 20 steps."""
    from hpcrl import cli

    overrides = {"dpo.steps": 20, "dpo.eval_every": 10, "run_root": str(tmp_path)}
    overrides |= {"logging.tensorboard": False, "logging.progress": False}
    args = [f"--{k}={v}" for k, v in overrides.items()]
    assert cli.main(["run", str(TEMPLATE), *args]) == 0
    [metrics] = list(tmp_path.glob("dpo_tiny/*/metrics.jsonl"))
    rows = read_jsonl(metrics)
    held = [
        (r["step"], r["dpo/heldout_accuracy"], r["dpo/heldout_margin"])
        for r in rows
        if "dpo/heldout_margin" in r
    ]
    assert [s for s, _, _ in held] == [0, 10, 20]
    assert held[0][1:] == (0.0, 0.0)  # policy == frozen reference: every implicit reward margin is 0
    assert held[-1][1] >= 0.8 and held[-1][2] > held[1][2] > 0, held
    assert rows[0]["dpo/loss"] == pytest.approx(torch.log(torch.tensor(2.0)).item(), rel=1e-5)
    assert rows[19]["dpo/loss"] < 0.65 and rows[19]["dpo/chosen_reward"] > rows[19]["dpo/rejected_reward"]
    assert not any(key.startswith("reward/") for row in rows for key in row)  # accuracy is not a reward
    assert (metrics.parent / "accuracy.png").exists() and not (metrics.parent / "reward.png").exists()
    assert str(metrics) in capsys.readouterr().out  # the run prints where its metrics go


@pytest.mark.heavy
@pytest.mark.dist
@pytest.mark.slow
def test_dpo_data_parallel_2_matches_one_rank(tmp_path):
    """Pairs are dispatched whole over DP ranks; d=2 gives d=1's losses (fp32, summation order only)."""
    common = {"dpo.steps": 3, "dpo.eval_every": 0, "dpo.pairs_per_step": 6}
    cfg1 = tiny_config(TEMPLATE, **common, **{"optim.micro_batch_size": 4})
    cfg2 = tiny_config(
        TEMPLATE, **common, **{"parallel.data": 2, "cluster.tasks_per_node": 2, "optim.micro_batch_size": 2}
    )
    run_ranks(run_dpo, 1, cfg1, str(tmp_path / "d1"), timeout_s=300)
    run_ranks(run_dpo, 2, cfg2, str(tmp_path / "d2"), timeout_s=300)
    one, two = read_jsonl(tmp_path / "d1" / "metrics.jsonl"), read_jsonl(tmp_path / "d2" / "metrics.jsonl")
    for a, b in zip(one, two, strict=True):
        assert b["dpo/loss"] == pytest.approx(a["dpo/loss"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)


@pytest.mark.heavy
@pytest.mark.parametrize("loss_type", ["ipo", "kto"])
def test_one_key_switches_dpo_to_ipo_and_kto_and_each_learns_the_preference(loss_type, tmp_path):
    """`--dpo.loss_type ipo|kto` on templates/dpo_tiny.yaml (the same paired data; KTO reads each pair as
    two unpaired rows): held-out preference accuracy 0 -> >= 0.9 in the template's 40 steps."""
    from hpcrl import cli

    overrides = {"dpo.loss_type": loss_type, "run_root": str(tmp_path)}
    overrides |= {"logging.tensorboard": False, "logging.progress": False}
    assert cli.main(["run", str(TEMPLATE), *[f"--{k}={v}" for k, v in overrides.items()]]) == 0
    [metrics] = list(tmp_path.glob("dpo_tiny/*/metrics.jsonl"))
    rows = read_jsonl(metrics)
    held = [r["dpo/heldout_accuracy"] for r in rows if "dpo/heldout_accuracy" in r]
    assert held[0] == 0.0 and held[-1] >= 0.9, held
    if loss_type == "kto":
        assert rows[0]["dpo/loss"] == pytest.approx(0.5)  # 1 - sigmoid(0): policy == reference, z0 = 0
        assert all(r["dpo/kl"] >= 0 for r in rows if "dpo/kl" in r)
    else:
        assert rows[0]["dpo/loss"] == pytest.approx((1 / (2 * 0.1)) ** 2)  # (h - 1/(2 beta))^2 at h = 0


def test_unpaired_rows_train_kto_and_are_refused_by_dpo(tmp_path):
    """Unpaired (prompt, completion, label) rows, some as conversations: KTO reads them; sigmoid names the
    first unpaired row; a non-boolean label is named with its row and key."""
    rows = [
        {"prompt": [{"role": "user", "content": f"{i}="}], "completion": str(i), "label": True}
        for i in range(6)
    ] + [{"prompt": f"{i}=", "completion": str(i + 1), "label": False} for i in range(6)]
    path = tmp_path / "unpaired.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = {"data.source": "jsonl", "data.path": str(path), "data.heldout_size": 4, "model.vocab_size": 24}
    kto = tiny_config(TEMPLATE, **base, **{"dpo.loss_type": "kto", "dpo.steps": 2, "dpo.pairs_per_step": 4})
    train, heldout = load_preference_splits(kto.data, _tokenizer_chat())
    assert train[0].prompt == "<bos><|user|>0=<eos><|assistant|>" and train[0].desirable
    assert len(heldout) == 4 and not heldout[-1].desirable
    with pytest.raises(ConfigError, match=r"row 0 is unpaired.*dpo.loss_type sigmoid needs pairs"):
        tiny_config(TEMPLATE, **base)  # refused when the config resolves: at expand, before any submit
    run_ranks(run_dpo, 1, kto, str(tmp_path / "kto"))
    assert [r["step"] for r in read_jsonl(tmp_path / "kto" / "metrics.jsonl") if "dpo/loss" in r] == [0, 1]
    path.write_text(json.dumps({"prompt": "1=", "completion": "1", "label": "yes"}) + "\n")
    with pytest.raises(ConfigError, match=r"row 0: label must be true or false, got 'yes'"):
        read_preference_jsonl(path)


def _tokenizer_chat():
    from hpcrl.data.tasks import ALPHABET
    from hpcrl.data.tokenizer import build_char_tokenizer

    return build_char_tokenizer(ALPHABET, 24)
