import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.data.config import DataConfig
from hpcrl.data.cursor import DataCursor, PromptSampler
from hpcrl.data.sources import load_splits
from hpcrl.data.tasks import ALPHABET, TASKS, get_task, make_splits, positional_score
from hpcrl.data.tokenizer import build_char_tokenizer, encode_prompts
from hpcrl.errors import ConfigError

TOKENIZER = build_char_tokenizer(ALPHABET)


def test_char_tokenizer_round_trips_and_pads_vocab(tmp_path):
    tok = build_char_tokenizer(ALPHABET, vocab_size=32)
    assert len(tok) == 32
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    ids = tok("12+3=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5 and tok.decode(ids) == "12+3="
    # ids 16..19 are the chat role tokens (room for them: 32 >= 20), the rest reserved
    assert tok.convert_ids_to_tokens([16, 19, 20]) == ["<|system|>", "<|tool|>", "<r0>"]
    assert tok.decode([tok.convert_tokens_to_ids("4"), 31, 2], skip_special_tokens=True) == "4<r11>"
    tok.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded("12", add_special_tokens=False)["input_ids"] == ids[:2]
    chat = [{"role": "user", "content": "12="}]
    assert reloaded.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        "<bos><|user|>12=<eos><|assistant|>"
    )


def test_vocab_too_small_names_the_key():
    with pytest.raises(ConfigError, match="model.vocab_size"):
        build_char_tokenizer(ALPHABET, vocab_size=8)


def test_encode_prompts_adds_bos_and_rejects_long_and_empty():
    tok = build_char_tokenizer(ALPHABET)
    assert encode_prompts(tok, ["12="], 4) == [[1, 5, 6, 15]]
    with pytest.raises(ConfigError, match=r"prompt 1 \('1234='\) has 6 tokens > 5") as err:
        encode_prompts(tok, ["1=", "1234=", ""], 5)
    assert "prompt 2 is empty" in str(err.value)


@pytest.mark.parametrize(
    ("name", "response", "score"),
    [
        ("copy_digits", "412", 1.0),
        ("copy_digits", "41", 2 / 3),
        ("copy_digits", "4120", 0.75),
        ("reverse_digits", "214", 1.0),
        ("add_digits", "46", 1.0),
        ("even_digits", "284", 1.0),
        ("even_digits", "213", 1 / 3),
        ("zero_digits", "000", 1.0),
        ("zero_digits", "0000", 0.75),
        ("reverse_exact", "214", 1.0),
        ("reverse_exact", "215", 0.0),
        ("reverse_exact", "2140", 0.0),
    ],
)
def test_task_rules(name, response, score):
    answers = {
        "copy_digits": "412",
        "reverse_digits": "214",
        "add_digits": "46",
        "even_digits": "000",
        "zero_digits": "000",
        "reverse_exact": "214",
    }
    assert TASKS[name].score(response, answers[name]) == pytest.approx(score)


def test_positional_score_of_empty():
    assert positional_score("", "") == 1.0 and positional_score("", "12") == 0.0


def test_splits_are_disjoint_and_deterministic():
    task = get_task("copy_digits")
    train, held = make_splits(task, 2, 300, 20, seed=3)
    assert len(train) == 300 and len({e.prompt for e in held}) == 20
    assert not {e.prompt for e in train} & {e.prompt for e in held}
    assert make_splits(task, 2, 300, 20, seed=3) == (train, held)
    assert all(e.prompt == e.answer + "=" for e in train)


def test_bad_task_and_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="unknown task 'sort'"):
        get_task("sort")
    with pytest.raises(ConfigError, match="data.train_size"):
        make_splits(get_task("copy_digits"), 1, 0, 2, 0)
    with pytest.raises(ConfigError, match="data.heldout_size"):
        make_splits(get_task("copy_digits"), 1, 5, 10, 0)


def _rows(n):
    return [{"prompt": f"q{i}", "answer": str(i)} for i in range(n)]


def test_jsonl_source_and_heldout_tail(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _rows(5)) + "\n")
    train, held = load_splits(DataConfig(source="jsonl", path=str(path), heldout_size=2), TOKENIZER)
    assert [e.prompt for e in train] == ["q0", "q1", "q2"] and [e.answer for e in held] == ["3", "4"]


def test_parquet_source(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="parquet needs pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(4)), path)
    train, held = load_splits(DataConfig(source="parquet", path=str(path), heldout_size=1), TOKENIZER)
    assert len(train) == 3 and held[0].prompt == "q3"


def test_hf_disk_source(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the optional `datasets` package is not installed")
    datasets.Dataset.from_list(_rows(4)).save_to_disk(str(tmp_path / "ds"))
    train, _ = load_splits(DataConfig(source="hf_disk", path=str(tmp_path / "ds"), heldout_size=1), TOKENIZER)
    assert len(train) == 3


def test_empty_missing_and_keyless_files_are_named(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty.jsonl.*dataset is empty"):
        load_splits(DataConfig(source="jsonl", path=str(empty), heldout_size=0), TOKENIZER)
    with pytest.raises(ConfigError, match="does not exist"):
        load_splits(DataConfig(source="jsonl", path=str(tmp_path / "nope.jsonl")), TOKENIZER)
    keyless = tmp_path / "k.jsonl"
    keyless.write_text('{"question": "1"}\n')
    with pytest.raises(ConfigError, match="row 0 has neither 'prompt' nor 'messages'"):
        load_splits(DataConfig(source="jsonl", path=str(keyless), heldout_size=0), TOKENIZER)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(ConfigError, match="line 1 is not JSON"):
        load_splits(DataConfig(source="jsonl", path=str(bad), heldout_size=0), TOKENIZER)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 20), st.integers(1, 9), st.integers(0, 40), st.integers(0, 5))
def test_sampler_resumes_exactly_from_its_cursor(num_rows, batch, split_after, seed):
    rows = list(range(num_rows))
    reference = PromptSampler(rows, DataCursor(seed=seed))
    stream = [reference.next_batch(batch) for _ in range(6)]
    first = PromptSampler(rows, DataCursor(seed=seed))
    cut = split_after % 6
    head = [first.next_batch(batch) for _ in range(cut)]
    resumed = PromptSampler(rows, DataCursor.from_dict(json.loads(json.dumps(first.cursor.to_dict()))))
    assert head + [resumed.next_batch(batch) for _ in range(6 - cut)] == stream


def test_each_epoch_visits_every_row_once():
    sampler = PromptSampler(list(range(10)), DataCursor(seed=1))
    epoch0 = sampler.next_batch(10)
    epoch1 = sampler.next_batch(10)
    assert sorted(epoch0) == sorted(epoch1) == list(range(10)) and epoch0 != epoch1
    assert sampler.cursor.to_dict() == {"epoch": 1, "index": 10, "seed": 1}
    with pytest.raises(ValueError, match="unknown keys"):
        DataCursor.from_dict({"epoch": 0, "index": 0, "seed": 0, "pos": 1})
    with pytest.raises(ValueError, match="empty dataset"):
        PromptSampler([], DataCursor())


def test_zero_digits_prompts_have_every_length_and_one_zero_per_digit():
    train, heldout = make_splits(get_task("zero_digits"), 15, 400, 32, seed=0)
    lengths = {len(e.prompt) - 1 for e in train + heldout}
    assert lengths <= set(range(16)) and len(lengths) >= 12
    assert all(e.answer == "0" * (len(e.prompt) - 1) and e.prompt.endswith("=") for e in train + heldout)


def test_long_tail_prompts_and_responses_have_real_lengths():
    """long_tail (issue 25): prompts of 5..48 characters (+ BOS: <= LONG_TAIL_PROMPT_TOKENS), responses of
    1..96 drawn geometric with mean num_digits: many short, a few long; the answer is the prompt's digits
    repeated to the asked length, so the rule can score it."""
    from hpcrl.data.tasks import LONG_TAIL_MAX_RESPONSE, LONG_TAIL_PROMPT_TOKENS

    train, heldout = make_splits(get_task("long_tail"), 16, 4000, 64, seed=0)
    lengths = [len(e.answer) for e in train]
    assert min(lengths) == 1 and max(lengths) <= LONG_TAIL_MAX_RESPONSE
    assert sum(lengths) / len(lengths) == pytest.approx(16, rel=0.1)  # the geometric's mean, barely cut
    assert sum(n > 48 for n in lengths) >= 0.03 * len(lengths)  # a tail: e^(-48/16) ~ 5 % beyond 48
    assert sorted(lengths)[len(lengths) // 2] <= 12  # and a median far below the mean's tail
    for e in train + heldout:
        asked, digits = e.prompt[:-1].split("+")
        assert int(asked) == len(e.answer) and e.answer == (digits * 96)[: int(asked)]
        assert 5 <= len(e.prompt) <= LONG_TAIL_PROMPT_TOKENS - 1 and e.prompt.endswith("=")
    assert make_splits(get_task("long_tail"), 16, 50, 8, seed=3) == make_splits(
        get_task("long_tail"), 16, 50, 8, seed=3
    )
    assert TASKS["long_tail"].score(train[0].answer, train[0].answer) == 1.0


def test_long_tail_with_prompts_cut_short_is_refused_at_expand(capsys):
    from pathlib import Path

    from hpcrl.cli import main

    template = Path(__file__).resolve().parents[2] / "templates" / "grpo_long_tail.yaml"
    assert main(["expand", str(template)]) == 0
    code = main(["expand", str(template), "--data.max_prompt_length", "32"])
    err = capsys.readouterr().err
    assert code == 2 and "data.max_prompt_length: 32: long_tail prompts have up to 49 tokens" in err, err
