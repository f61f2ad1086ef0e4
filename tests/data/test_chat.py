"""Chat rows: parsing (hostile rows named by file, row and key), rendering with the tokenizer's chat
template, and the assistant-only loss mask of multi-turn SFT, checked against transformers' own
`return_assistant_tokens_mask` and by gradients."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.data.chat import Message, continuation_ids, conversation_segments, render_ids
from hpcrl.data.config import DataConfig
from hpcrl.data.sources import load_splits, read_examples
from hpcrl.data.tasks import ALPHABET
from hpcrl.data.tokenizer import CHAT_VOCAB_SIZE, build_char_tokenizer
from hpcrl.errors import ConfigError
from hpcrl.posttrain.sft import sft_loss
from hpcrl.stages.sequences import example_batch
from hpcrl.train.logprobs import HeadOutputs

TOKENIZER = build_char_tokenizer(ALPHABET, CHAT_VOCAB_SIZE + 4)
TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "sft_tiny.yaml"
DIGITS = st.text("0123456789=+", max_size=5)
FIRST = st.tuples(st.sampled_from(["system", "user", "tool"]), DIGITS)  # an assistant first is refused
TURNS = st.lists(
    st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]), DIGITS), min_size=1, max_size=6
)


@settings(max_examples=60, deadline=None)
@given(FIRST, TURNS)
def test_assistant_mask_equals_transformers_assistant_tokens_mask(first, rest):
    """The prefix-rendering mask (any template) equals transformers' mask from the tiny template's
    {% generation %} markers, on random conversations: every assistant turn's content and <eos>, only."""
    conversation = tuple(Message(role, content) for role, content in [first, *rest])
    segments = conversation_segments(TOKENIZER, conversation)
    ids = [t for s in segments for t in s.ids]
    mask = [s.trained for s in segments for _ in s.ids]
    reference = TOKENIZER.apply_chat_template(
        [m.as_dict() for m in conversation], return_dict=True, return_assistant_tokens_mask=True
    )
    assert ids == reference["input_ids"]
    assert mask == [bool(m) for m in reference["assistant_masks"]]
    assert sum(mask) == sum(len(m.content) + 1 for m in conversation if m.role == "assistant")


def _write(tmp_path, rows, name="chat.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


CONVERSATION = [
    {"role": "system", "content": "0"},
    {"role": "user", "content": "12="},
    {"role": "assistant", "content": "21"},
    {"role": "user", "content": "345="},
    {"role": "assistant", "content": "543"},
]


def test_chat_rows_render_rl_prompts_with_the_generation_prompt(tmp_path):
    path = _write(
        tmp_path,
        [
            {"messages": CONVERSATION},
            {"prompt": [{"role": "user", "content": "7="}], "answer": "7"},
            {"prompt": "8=", "answer": "8"},  # a flat row next to chat rows
        ],
    )
    train, heldout = load_splits(DataConfig(source="jsonl", path=str(path), heldout_size=1), TOKENIZER)
    first, second = train
    assert (
        first.prompt
        == "<bos><|system|>0<eos><|user|>12=<eos><|assistant|>21<eos><|user|>345=<eos><|assistant|>"
    )
    assert first.answer == "543" and first.conversation[-1] == Message("assistant", "543")
    assert second.prompt == "<bos><|user|>7=<eos><|assistant|>" and second.answer == "7"
    assert heldout[0].prompt == "8=" and heldout[0].conversation is None


HOSTILE = [
    ({"messages": []}, "row 0: empty conversation", "data.messages"),
    ({"messages": "hi"}, "row 0: expected a list", "data.messages"),
    ({"messages": [{"content": "1"}]}, "row 0: message 0 has no 'role'", "data.messages"),
    ({"messages": [{"role": "user"}]}, "row 0: message 0 has no 'content'", "data.messages"),
    ({"messages": [{"role": "root\x1b[2J", "content": "1"}]}, "row 0: message 0 has role", "data.messages"),
    ({"messages": [{"role": "user", "content": 7}]}, "content is a int, not a string", "data.messages"),
    ({"messages": [{"role": "user", "content": "1", "tool_calls": []}]}, "unsupported keys", "data.messages"),
    ({"messages": ["user: 1"]}, "message 0 is a str", "data.messages"),
    ({"prompt": [{"role": "user", "content": "1"}], "answer": [{"role": "user", "content": "1"}]},
     "expected one assistant message", "data.answer"),
    (["not", "a", "mapping"], "row 0 is a list, not a mapping", "data.path"),
    ({"messages": [{"role": "assistant", "content": "1"}]}, "the first turn is the assistant's", "data.messages"),
    ({"question": "1="}, "row 0 has neither 'prompt' nor 'messages'", "data.prompt_key"),
]  # fmt: skip


@pytest.mark.parametrize(("row", "message", "key"), HOSTILE)
def test_hostile_chat_rows_name_file_row_and_key(tmp_path, row, message, key):
    path = _write(tmp_path, [row, {"prompt": "1=", "answer": "1"}])
    with pytest.raises(ConfigError) as err:
        read_examples(DataConfig(source="jsonl", path=str(path)))
    (problem,) = err.value.problems
    assert message in problem.message and problem.key == key and problem.file == str(path)
    assert "\x1b" not in str(err.value)  # a terminal escape in a role is quoted, never printed raw


def test_a_model_without_a_chat_template_is_a_config_error(tmp_path):
    path = _write(tmp_path, [{"messages": CONVERSATION}, {"messages": CONVERSATION}])
    plain = build_char_tokenizer(ALPHABET, 16)  # no room for the role tokens: no template
    with pytest.raises(ConfigError, match=r"row 0: chat rows need a chat template"):
        load_splits(DataConfig(source="jsonl", path=str(path), heldout_size=1), plain)


def _loss_and_grads(conversation: tuple[Message, ...]):
    """SFT's loss on one chat row, through a tiny causal model: its parameter gradients and its gradient
    with respect to every token's log-prob."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(len(TOKENIZER), 8)
    mix = torch.nn.Linear(8, len(TOKENIZER))
    batch = example_batch([_example(conversation)], TOKENIZER, max_prompt_length=64, context=64)
    hidden_BSH = embed(batch.input_ids_BT).cumsum(dim=1)  # causal: position t sees tokens <= t only
    logits_BSV = mix(hidden_BSH)[:, :-1]
    logp_BS = torch.log_softmax(logits_BSV, -1).gather(-1, batch.input_ids_BT[:, 1:, None]).squeeze(-1)
    logp_BS.retain_grad()
    shifted = batch.slice(0, 1)
    shifted.input_ids_BT, shifted.response_mask_BT = batch.input_ids_BT[:, 1:], batch.response_mask_BT[:, 1:]
    shifted.num_global_response_tokens, shifted.num_global_seqs = int(shifted.response_mask_BT.sum()), 1
    loss, _ = sft_loss(HeadOutputs(logprobs_BT=logp_BS, greedy_BT=torch.zeros_like(logp_BS)), shifted)
    loss.backward()
    return [p.grad.clone() for p in (*embed.parameters(), *mix.parameters())], logp_BS.grad, shifted


def _example(conversation):
    from hpcrl.data.tasks import Example

    return Example("", "", conversation)


def test_sft_loss_ignores_system_user_and_tool_tokens():
    """No loss flows through a non-assistant token's log-prob, and rewriting the user and tool turns
    after the last assistant turn changes no parameter gradient."""
    base = tuple(Message(m["role"], m["content"]) for m in CONVERSATION)
    grads, logp_grad_BS, batch = _loss_and_grads((*base, Message("tool", "99"), Message("user", "1")))
    assert (logp_grad_BS[~batch.response_mask_BT] == 0).all()
    assert (logp_grad_BS[batch.response_mask_BT] != 0).all()  # every assistant token (and <eos>) learns
    assert int(batch.response_mask_BT.sum()) == len("21") + 1 + len("543") + 1
    other, _, _ = _loss_and_grads((*base, Message("tool", "1234+"), Message("user", "=")))
    assert all(torch.equal(a, b) for a, b in zip(grads, other, strict=True))


@pytest.mark.heavy
def test_expand_refuses_a_malformed_chat_file_naming_file_row_and_key(tmp_path):
    """The data file is read at expand: a bad row, or chat rows for a tokenizer without role tokens, is
    exit 2 naming the file, the row and the key."""
    bad = _write(tmp_path, [{"messages": CONVERSATION}, {"messages": [{"role": "user"}]}], "bad.jsonl")
    good = _write(tmp_path, [{"messages": CONVERSATION}] * 3, "good.jsonl")

    def expand(path, vocab_size):
        argv = ["expand", str(TEMPLATE), "--data.source", "jsonl", "--data.path", str(path)]
        argv += ["--data.heldout_size", "1", "--model.vocab_size", str(vocab_size)]
        return subprocess.run([sys.executable, "-m", "hpcrl", *argv], capture_output=True, text=True)

    result = expand(bad, 24)
    assert result.returncode == 2, result.stderr
    assert "row 1: message 0 has no 'content'" in result.stderr and str(bad) in result.stderr
    assert "data.messages" in result.stderr
    assert expand(good, 24).returncode == 0
    small = expand(good, 16)
    assert (
        small.returncode == 2
        and "model.vocab_size: chat rows need the tiny tokenizer's role tokens" in small.stderr
    )


def test_parquet_chat_prompts_as_verl_writes_them(tmp_path):
    """verl's RL parquet: `prompt` a list of {role, content} structs; rendered with the generation prompt."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [{"prompt": [{"role": "user", "content": f"{i}="}], "answer": str(i)} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rl.parquet")
    train, _ = load_splits(
        DataConfig(source="parquet", path=str(tmp_path / "rl.parquet"), heldout_size=1), TOKENIZER
    )
    assert [(e.prompt, e.answer) for e in train] == [
        ("<bos><|user|>0=<eos><|assistant|>", "0"),
        ("<bos><|user|>1=<eos><|assistant|>", "1"),
    ]


OBSERVED = st.lists(st.tuples(st.sampled_from(["system", "user", "tool"]), DIGITS), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(FIRST, TURNS, DIGITS, OBSERVED)
def test_a_continuation_is_what_the_template_renders_after_an_assistant_turn(first, rest, answer, observed):
    """Episode rows are built turn by turn: the conversation so far (through an assistant turn), then an
    environment's messages as `continuation_ids`, must be the template's rendering of the whole
    conversation with the generation prompt - token for token, so the model reads what it would read."""
    so_far = [Message(*first), *(Message(*t) for t in rest), Message("assistant", answer)]
    more = [Message(*t) for t in observed]
    whole = render_ids(TOKENIZER, [*so_far, *more], add_generation_prompt=True)
    assert (
        render_ids(TOKENIZER, so_far, add_generation_prompt=False) + continuation_ids(TOKENIZER, more)
        == whole
    )


def test_a_template_that_rewrites_earlier_turns_has_no_continuation():
    tokenizer = build_char_tokenizer(ALPHABET, CHAT_VOCAB_SIZE + 4)
    tokenizer.chat_template = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="renders earlier turns differently"):
        continuation_ids(tokenizer, [Message("tool", "1")])
