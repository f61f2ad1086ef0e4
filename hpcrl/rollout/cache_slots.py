"""The rows of megatron-core's static KV cache as slots a ragged decode fills and frees: continuous
batching over `StaticInferenceContext` (hpcrl.rollout.megatron_engine).

Megatron's static attention reads and writes cache rows [batch_size_offset, + batch) and columns
[0, sequence_len_offset + new tokens) (attention.py `_adjust_key_value_for_inference`), every row at one
shared column. So:
- a finished row leaves by moving the rows still decoding to the front (`drop`);
- a waiting prompt joins in a free row with its prompt right-aligned to end at the shared column, its
  earlier columns masked (`add`; the engine prefills it there);
- the cache stores keys unrotated and applies RoPE at read time by column, so moving every row's
  columns left by the same amount keeps every query-key distance: when the shared column reaches the
  cache's end, `shift` drops the columns no live row uses. A live row spans at most its prompt and
  its response, so a cache of P + T columns (P the longest prompt, T max_new_tokens) never runs out,
  and holds exactly what a static batch of the same rows would (hpcrl.plan.memory's KV cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CacheSlots:
    """The live rows of a static cache, in cache order (slot i = cache row i)."""

    context: object
    """megatron's StaticInferenceContext (its key_value_memory_dict is allocated by the first forward)."""
    columns: int
    """The cache's columns (its max_sequence_length)."""
    column: int
    """The next column a decode step writes (the shared sequence offset)."""
    rows_A: torch.Tensor
    """int64 [A]: the batch row each slot holds."""
    positions_A: torch.Tensor
    """int64 [A]: tokens each slot has sampled."""
    pending_A: torch.Tensor
    """int64 [A]: each slot's last sampled token, not yet in the cache."""
    keep_AC: torch.Tensor
    """bool [A, columns]: the columns each slot attends to (its prompt and the tokens written since)."""

    @classmethod
    def empty(cls, context, columns: int, column: int, device: torch.device) -> CacheSlots:
        none = torch.zeros(0, dtype=torch.long)
        keep = torch.zeros(0, columns, dtype=torch.bool, device=device)
        return cls(context, columns, column, none, none, none, keep)

    def __len__(self) -> int:
        return len(self.rows_A)

    def add(self, rows: list[int], lengths: list[int]) -> None:
        """Slots for batch rows `rows` whose prompts (of `lengths` tokens) end at `self.column`."""
        keep = torch.zeros(len(rows), self.columns, dtype=torch.bool, device=self.keep_AC.device)
        for i, n in enumerate(lengths):
            keep[i, self.column - n : self.column] = True
        self.rows_A = torch.cat([self.rows_A, torch.tensor(rows, dtype=torch.long)])
        self.positions_A = torch.cat([self.positions_A, torch.zeros(len(rows), dtype=torch.long)])
        self.pending_A = torch.cat([self.pending_A, torch.zeros(len(rows), dtype=torch.long)])
        self.keep_AC = torch.cat([self.keep_AC, keep])

    def drop(self, finished_A: torch.Tensor) -> None:
        """Free the slots of `finished_A` rows: the others move to the front of every layer's cache."""
        if not bool(finished_A.any()):
            return
        live = (~finished_A).nonzero().flatten()
        rows = live.to(self.keep_AC.device)
        used = self.column  # columns [0, column) hold data; the pending tokens are not written yet
        for keys, values in self.context.key_value_memory_dict.values():
            keys[:used, : len(live)] = keys[:used, rows]
            values[:used, : len(live)] = values[:used, rows]
        self.rows_A, self.positions_A = self.rows_A[live], self.positions_A[live]
        self.pending_A, self.keep_AC = self.pending_A[live], self.keep_AC[rows]

    def shift(self, keep_columns: int) -> None:
        """When the shared column is the cache's end: move every slot's columns left by the most that
        keeps the first column any slot reads and at least `keep_columns` columns before the shared one
        (room for a joining prompt)."""
        if self.column < self.columns:
            return
        first_read = int(self.keep_AC.float().argmax(dim=1).min()) if len(self) else self.column
        by = min(first_read, self.column - keep_columns)
        if by <= 0:
            raise RuntimeError(
                f"the KV cache of {self.columns} columns is full (shared column {self.column})"
            )
        n = len(self)
        for keys, values in self.context.key_value_memory_dict.values():
            keys[: self.column - by, :n] = keys[by : self.column, :n].clone()
            values[: self.column - by, :n] = values[by : self.column, :n].clone()
        self.keep_AC = torch.nn.functional.pad(self.keep_AC[:, by:], (0, by))
        self.column -= by

    def decode_mask(self) -> torch.Tensor:
        """Megatron's mask [A, 1, 1, column + 1] for the slots' pending tokens written at `column`; marks
        that column as read by every slot from now on (the one place `keep_AC` grows in a decode)."""
        self.keep_AC[:, self.column] = True
        return ~self.keep_AC[:, None, None, : self.column + 1]
