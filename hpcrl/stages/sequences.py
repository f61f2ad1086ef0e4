"""Prompt + response rows as one right-padded training batch: what the offline stages train on (SFT on
(prompt, answer) rows, DPO on (prompt, chosen) and (prompt, rejected) rows).

Row b = prompt tokens + response tokens + <eos>, right padded; the response mask covers the response and
its <eos> (the model learns to stop), never the prompt or the padding. Shape legend: B rows, S tokens.
"""

from __future__ import annotations

import torch

from hpcrl.data.tokenizer import encode_prompts
from hpcrl.errors import ConfigError, Problem
from hpcrl.train.batch import TrainBatch


def response_batch(
    prompts: list[str], responses: list[str], tokenizer, max_prompt_length: int, context: int
) -> TrainBatch:
    """The [B, S] batch of rows (prompts[b], responses[b]); a row longer than the model's context is a
    ConfigError naming the first such prompt."""
    prompt_ids = encode_prompts(tokenizer, prompts, max_prompt_length)
    response_ids = tokenizer(responses, add_special_tokens=False)["input_ids"]
    rows = [p + list(r) + [tokenizer.eos_token_id] for p, r in zip(prompt_ids, response_ids, strict=True)]
    too_long = [b for b, row in enumerate(rows) if len(row) > context]
    if too_long:
        raise ConfigError(
            Problem(
                f"{len(too_long)} row(s) exceed the model's context of {context} tokens "
                f"(first: {prompts[too_long[0]][:40]!r})",
                key="model.max_position_embeddings",
            )
        )
    width = max(len(row) for row in rows)
    ids_BS = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_BS = torch.zeros((len(rows), width), dtype=torch.bool)
    response_BS = torch.zeros((len(rows), width), dtype=torch.bool)
    for b, (row, prompt) in enumerate(zip(rows, prompt_ids, strict=True)):
        ids_BS[b, : len(row)] = torch.tensor(row)
        attention_BS[b, : len(row)] = True
        response_BS[b, len(prompt) : len(row)] = True
    return TrainBatch(ids_BS, attention_BS, response_BS)
