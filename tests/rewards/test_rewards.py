import math

import pytest
import torch

from hpcrl.data.config import DataConfig
from hpcrl.data.tasks import ALPHABET
from hpcrl.data.tokenizer import build_char_tokenizer
from hpcrl.errors import ConfigError
from hpcrl.rewards.config import RewardConfig
from hpcrl.rewards.rule_rewards import exact_match, extract_hash_answer, format_check, gsm8k
from hpcrl.rewards.scoring import RewardError, build_scorer, rule_batch_scorer, score_batch


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("so 3+4 #### 7", "7"),
        ("#### 1,234", "1234"),
        ("a #### 2 then #### -3.5", "-3.5"),
        ("no answer", None),
        ("#### 4.0", "4"),
    ],
)
def test_extract_hash_answer(text, number):
    assert extract_hash_answer(text) == number


def test_rules_by_example():
    assert gsm8k("", "thus #### 42", "Natalia sold ... #### 42") == 1.0
    assert gsm8k("", "#### 41", "42") == 0.0 and gsm8k("", "42", "42") == 0.0
    assert exact_match("", " 12 ", "12") == 1.0 and exact_match("", "13", "12") == 0.0
    assert format_check("", "work\n#### 5 ", "") == 1.0 and format_check("", "#### five", "") == 0.0


def test_task_reward_uses_the_tasks_rule():
    scorer = build_scorer(RewardConfig(name="task"), DataConfig(task="reverse_digits"))
    assert scorer(["123="] * 2, ["321", "123"], ["321"] * 2) == [1.0, pytest.approx(1 / 3)]


def test_unknown_reward_and_bad_policy_list_every_problem():
    with pytest.raises(ConfigError) as err:
        build_scorer(RewardConfig(name="bleu", nan_policy="ignore"), DataConfig())
    text = str(err.value)
    assert "reward.nan_policy" in text and "unknown reward 'bleu'" in text
    with pytest.raises(ConfigError, match="reward.model_path"):
        build_scorer(RewardConfig(name="model"), DataConfig())


def _flaky(prompt, response, answer):
    if response == "boom":
        raise ZeroDivisionError("bad sample")
    return math.nan if response == "nan" else 1.0


def test_nan_policy_error_names_the_sample_and_cause():
    scorer = rule_batch_scorer(_flaky)
    with pytest.raises(RewardError, match=r"sample 1 .*'boom'.*ZeroDivisionError"):
        score_batch(scorer, ["p"] * 3, ["ok", "boom", "nan"], ["a"] * 3, "error")
    with pytest.raises(RewardError, match=r"sample 2 .*returned nan"):
        score_batch(scorer, ["p"] * 3, ["ok", "ok", "nan"], ["a"] * 3, "error")


def test_nan_policy_skip_drops_and_counts():
    result = score_batch(rule_batch_scorer(_flaky), ["p"] * 3, ["ok", "boom", "nan"], ["a"] * 3, "skip")
    assert result.keep_B.tolist() == [True, False, False] and result.num_skipped == 2
    assert result.scores_B.tolist() == [1.0, 0.0, 0.0] and len(result.reasons) == 2


def test_reward_model_scores_end_to_end(tmp_path):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = build_char_tokenizer(ALPHABET, vocab_size=32)
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    LlamaForSequenceClassification(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    scorer = build_scorer(RewardConfig(name="model", model_path=str(tmp_path)), DataConfig())
    scores = scorer(["12=", "1="], ["12", "9999"], ["", ""])
    alone = scorer(["1="], ["9999"], [""])
    assert len(scores) == 2 and scores[0] != scores[1]
    assert alone[0] == pytest.approx(scores[1], abs=1e-5)  # padding in a batch does not change a score
    result = score_batch(scorer, ["12="], ["12"], [""], "error")
    assert result.scores_B.item() == pytest.approx(scores[0], abs=1e-5)
