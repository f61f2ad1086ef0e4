"""Prompt + response rows as one right-padded training batch: what the offline stages train on (SFT on
(prompt, answer) rows and on chat conversations, DPO on (prompt, chosen) and (prompt, rejected) rows).

A row is a list of segments (hpcrl.data.chat.Segment): token runs that carry the loss or not. A flat row
is two: prompt tokens (not trained), then response tokens + <eos> (trained: the model learns to stop). A
chat row is its conversation under the chat template, every assistant turn trained and every system,
user and tool turn not (hpcrl.data.chat.conversation_segments). Padding is never trained.
Shape legend: B rows, S tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hpcrl.data.chat import Segment, conversation_segments
from hpcrl.data.tasks import Example
from hpcrl.data.tokenizer import encode_prompts
from hpcrl.errors import ConfigError, Problem
from hpcrl.train.batch import TrainBatch


def response_batch(
    prompts: list[str], responses: list[str], tokenizer, max_prompt_length: int, context: int
) -> TrainBatch:
    """The [B, S] batch of rows (prompts[b], responses[b]); a row longer than the model's context is a
    ConfigError naming the first such prompt."""
    return segment_batch(
        flat_rows(prompts, responses, tokenizer, max_prompt_length), tokenizer, context, prompts
    )


def example_batch(examples: list[Example], tokenizer, max_prompt_length: int, context: int) -> TrainBatch:
    """SFT's batch: chat rows as their conversation's segments, flat rows as (prompt, answer)."""
    flat = [e for e in examples if e.conversation is None]
    flat_segments = iter(
        flat_rows([e.prompt for e in flat], [e.answer for e in flat], tokenizer, max_prompt_length)
    )
    rows = [
        next(flat_segments) if e.conversation is None else conversation_segments(tokenizer, e.conversation)
        for e in examples
    ]
    return segment_batch(rows, tokenizer, context, [e.prompt for e in examples])


def flat_rows(
    prompts: list[str], responses: list[str], tokenizer, max_prompt_length: int
) -> list[list[Segment]]:
    """(prompt, response + <eos>) segments per row; the prompt rule of hpcrl.data.tokenizer.encode_prompts."""
    if not prompts:
        return []  # a batch of chat rows only (the tokenizer refuses an empty list)
    prompt_ids = encode_prompts(tokenizer, prompts, max_prompt_length)
    response_ids = tokenizer(responses, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return [
        [Segment(tuple(p), False), Segment((*r, eos), True)]
        for p, r in zip(prompt_ids, response_ids, strict=True)
    ]


def segment_batch(rows: list[list[Segment]], tokenizer, context: int, names: Sequence[str]) -> TrainBatch:
    """The right-padded [B, S] batch of `rows`, the response mask over their trained segments; a row longer
    than `context` is a ConfigError naming the first (by `names[b]`)."""
    ids = [[t for s in row for t in s.ids] for row in rows]
    too_long = [b for b, row in enumerate(ids) if len(row) > context]
    if too_long:
        raise ConfigError(
            Problem(
                f"{len(too_long)} row(s) exceed the model's context of {context} tokens "
                f"(first: {names[too_long[0]][:40]!r})",
                key="model.max_position_embeddings",
            )
        )
    width = max(len(row) for row in ids)
    ids_BS = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_BS = torch.zeros((len(rows), width), dtype=torch.bool)
    response_BS = torch.zeros((len(rows), width), dtype=torch.bool)
    for b, (row, segments) in enumerate(zip(ids, rows, strict=True)):
        ids_BS[b, : len(row)] = torch.tensor(row)
        attention_BS[b, : len(row)] = True
        start = 0
        for segment in segments:
            response_BS[b, start : start + len(segment.ids)] = segment.trained
            start += len(segment.ids)
    return TrainBatch(ids_BS, attention_BS, response_BS)
