"""Character-level tokenizer for the built-in tasks, built with `tokenizers` (WordLevel, one char a token).

It is an ordinary `PreTrainedTokenizerFast`, so it saves next to an HF model directory and reloads
offline. Reserved (non-special) tokens fill the vocabulary up to the model's `vocab_size`, so every id
the model can sample decodes to something visible (`<r3>`) and is never silently dropped.

Chat: when the vocabulary has room (vocab_size >= CHAT_VOCAB_SIZE, or unsized), four role tokens follow
the alphabet (ids of the alphabet never move, so a model trained without them reads the same ids) and the
tokenizer carries TINY_CHAT_TEMPLATE, so chat rows on CPU take the path an Instruct model's take
(hpcrl.data.chat). The template marks assistant turns with `{% generation %}`, which lets transformers'
own `return_assistant_tokens_mask` check hpcrl's assistant-only mask in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hpcrl.data.tasks import ALPHABET
from hpcrl.errors import ConfigError, Problem

if TYPE_CHECKING:  # importing transformers costs ~0.5 s of CPU: `hpcrl expand` and every rule that reads
    # CHAT_VOCAB_SIZE would pay it (tests/cli/test_cli.py holds the line)
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
CHAT_VOCAB_SIZE = len(SPECIAL_TOKENS) + len(dict.fromkeys(ALPHABET)) + len(ROLE_TOKENS)
"""Smallest model.vocab_size whose tiny tokenizer has the role tokens chat rows need."""
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}<|assistant|>{% generation %}"
    "{{ message['content'] }}{{ eos_token }}{% endgeneration %}"
    "{% else %}<|{{ message['role'] }}|>{{ message['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""Each turn is `<|role|>content<eos>`; the generation prompt is `<|assistant|>`, so a sampled turn ends
at <eos> as a flat response does."""


def build_char_tokenizer(alphabet: str, vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """Ids: <pad>=0, <bos>=1, <eos>=2, <unk>=3, then the alphabet's characters in order, then the role
    tokens when the vocabulary has room for them, then reserved."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(alphabet))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab[ch] = len(vocab)
    chat = vocab_size is None or vocab_size >= len(vocab) + len(ROLE_TOKENS)
    for role in ROLE_TOKENS if chat else ():
        vocab[role] = len(vocab)
    if vocab_size is not None:
        if vocab_size < len(vocab):
            raise ConfigError(
                Problem(f"is {vocab_size} but the tokenizer needs {len(vocab)} ids", key="model.vocab_size")
            )
        for i in range(vocab_size - len(vocab)):
            vocab[f"<r{i}>"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        extra_special_tokens=list(ROLE_TOKENS) if chat else [],
    )
    if chat:
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def model_tokenizer(hf_path: str | None, vocab_size: int | None) -> PreTrainedTokenizerBase:
    """A model's tokenizer: its HF directory's when it starts from one (the pad token set to EOS where the
    model has none, e.g. Llama-2: padding is masked out, any id will do), else the built-in char
    tokenizer over the tasks' ALPHABET, sized to `vocab_size` (what every random-init job trains with,
    and what an HF export of such a job carries)."""
    if hf_path is None:
        return build_char_tokenizer(ALPHABET, vocab_size=vocab_size)
    from transformers import AutoTokenizer  # the class that reads any HF directory's tokenizer files

    tokenizer = AutoTokenizer.from_pretrained(hf_path, local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], max_prompt_length: int
) -> list[list[int]]:
    """Token ids per prompt (with one BOS when the tokenizer has one). A prompt longer than
    `max_prompt_length` tokens, or an empty one, raises ConfigError naming it: never silently cut."""
    ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    out: list[list[int]] = []
    problems: list[Problem] = []
    for i, (text, row) in enumerate(zip(prompts, ids, strict=True)):
        row = list(row) if bos is None or row[:1] == [bos] else [bos, *row]  # a chat template may write it
        if len(row) > max_prompt_length:
            problems.append(
                Problem(
                    f"prompt {i} ({text[:40]!r}) has {len(row)} tokens > {max_prompt_length}",
                    key="data.max_prompt_length",
                )
            )
        if not text:
            problems.append(Problem(f"prompt {i} is empty", key="data.prompt_key"))
        out.append(row)
    if problems:
        raise ConfigError(
            problems[:10] + ([Problem(f"... and {len(problems) - 10} more")] if len(problems) > 10 else [])
        )
    return out
