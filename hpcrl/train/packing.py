"""Packed sequences (`optim.pack_sequences`; verl's `use_remove_padding`, OpenRLHF's `packing_samples`):
the training forward runs several sequences back to back in each row instead of one padded sequence
per row, so it computes (almost) only real tokens.

Layout. A padded micro-batch [B, T] (each row's real tokens contiguous: a left-padded prompt, the
response, right padding) becomes R rows of W columns: every row holds whole sequences, placed by
first-fit decreasing (hpcrl.train.token_budget.fill_rows), the rest of the row padding. W is a multiple
of the longest sequence, the one whose rows cost the fewest FLOPs (`row_width`).

Attention is block-diagonal causal: query q sees key k iff both are in the same sequence and k <= q
(the mask megatron's local attention takes, True = masked out); a padding position sees itself only,
which keeps its softmax finite; its output is dropped.

Positions. Megatron's RoPE gives column j the angle j*theta whatever position_ids say (docs/FACTS.md).
A sequence starting at column o thus gets (o+i)*theta, and RoPE's attention score depends on the angle
difference (o+i)*theta - (o+k)*theta = (i-k)*theta only (Su et al. 2021, RoFormer §3.4.2), so each
sequence sees exactly what it sees alone, as a left-padded row already does.

Outputs. The head runs on the packed rows (the [R, W, V] logits are the big tensors), then `unpack`
gathers its [R, W] outputs back to [B, T], so every loss reads the padded micro-batch as before and
every `loss_agg` is unchanged. Token t's log-prob comes from the output at its sequence's column t-1; a
sequence's first token would read the previous sequence's last output, as a left-padded row's first token
reads a pad's, so no loss may read it: `check_first_tokens` refuses a batch whose response starts a
sequence (a prompt always precedes a response), and `unpack` zeroes padding.

GPU: megatron's THD format (PackedSeqParams with cu_seqlens) needs Transformer Engine's attention, which
hpcrl's local layer spec does not build; the dense block mask here runs on either device.

Public: `PackedRows`, `packed_micro_batches`, `row_width`, `check_first_tokens`,
`check_attention_takes_masks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpcrl.errors import ConfigError, Problem
from hpcrl.train.token_budget import fill_rows


@dataclass(frozen=True)
class PackedRows:
    """Where each real token of a padded [B, T] batch sits in R packed rows of W columns."""

    source_BT: torch.Tensor
    """int64 [B, T]: the flat index (r * W + column) of token (b, t) in the packed rows; -1 on padding."""
    sequence_RW: torch.Tensor
    """int64 [R, W]: which of the B sequences each packed column holds; -1 on padding."""

    @classmethod
    def of(
        cls, attention_mask_BT: torch.Tensor, rows: list[list[int]] | None = None, width: int | None = None
    ) -> PackedRows:
        """Pack `attention_mask_BT`'s sequences into `rows` (sequence indices per row, in order; default
        first-fit decreasing) of `width` columns (default the longest sequence)."""
        keep_BT = attention_mask_BT.bool()
        lengths = keep_BT.sum(dim=1).tolist()
        starts = keep_BT.long().argmax(dim=1).tolist()
        _check_contiguous(keep_BT, lengths, starts)
        width = width or max(max(lengths), 1)
        rows = rows if rows is not None else fill_rows(lengths, width)
        B, T = keep_BT.shape
        source_BT = torch.full((B, T), -1, dtype=torch.long)
        sequence_RW = torch.full((len(rows), width), -1, dtype=torch.long)
        for r, row in enumerate(rows):
            column = 0
            for b in row:
                n = lengths[b]
                if column + n > width:
                    raise ValueError(f"row {r} holds {column + n} tokens, more than its {width} columns")
                source_BT[b, starts[b] : starts[b] + n] = torch.arange(
                    r * width + column, r * width + column + n
                )
                sequence_RW[r, column : column + n] = b
                column += n
        placed = [b for row in rows for b in row]
        if len(placed) != len(set(placed)) or not {b for b in range(B) if lengths[b]} <= set(placed):
            raise ValueError("the rows must hold every non-empty sequence exactly once")
        device = attention_mask_BT.device
        return cls(source_BT.to(device), sequence_RW.to(device))

    def to(self, device: torch.device) -> PackedRows:
        return PackedRows(self.source_BT.to(device), self.sequence_RW.to(device))

    @property
    def shape(self) -> tuple[int, int]:
        """(R, W)."""
        return tuple(self.sequence_RW.shape)

    @property
    def computed_tokens(self) -> int:
        return self.sequence_RW.numel()

    @property
    def real_tokens(self) -> int:
        return int((self.sequence_RW >= 0).sum())

    def pack(self, x_BT: torch.Tensor, fill: int | float = 0) -> torch.Tensor:
        """[B, T, ...] -> [R, W, ...] (padding = `fill`)."""
        real_BT = self.source_BT >= 0
        out = x_BT.new_full((self.computed_tokens, *x_BT.shape[2:]), fill)
        out[self.source_BT[real_BT]] = x_BT[real_BT]
        return out.reshape(*self.shape, *x_BT.shape[2:])

    def unpack(self, x_RW: torch.Tensor) -> torch.Tensor:
        """[R, W, ...] -> [B, T, ...] (0 on padding); differentiable (a gather)."""
        flat = x_RW.reshape(self.computed_tokens, *x_RW.shape[2:])
        real_BT = self.source_BT >= 0
        gathered = flat[self.source_BT.clamp(min=0)]
        mask = real_BT.reshape(*real_BT.shape, *([1] * (gathered.dim() - 2)))
        return torch.where(mask, gathered, torch.zeros((), dtype=gathered.dtype, device=gathered.device))

    def attention_mask(self) -> torch.Tensor:
        """Megatron's boolean [R, 1, W, W], True = masked out: block-diagonal causal, padding sees itself."""
        seq_RW = self.sequence_RW
        W = seq_RW.shape[1]
        causal_WW = torch.ones(W, W, dtype=torch.bool, device=seq_RW.device).tril()
        same_RWW = (seq_RW[:, :, None] == seq_RW[:, None, :]) & (seq_RW[:, :, None] >= 0)
        itself_WW = torch.eye(W, dtype=torch.bool, device=seq_RW.device)
        return ~((same_RWW & causal_WW) | itself_WW)[:, None]


def check_attention_takes_masks(model: torch.nn.Module) -> None:
    """Packed rows need an attention that applies the block mask it is given: megatron's local
    DotProductAttention does; Transformer Engine's (the layer spec hpcrl.train.model builds on CUDA where
    it is installed) applies its own mask type and ignores it, so packed sequences would attend across."""
    if any(type(m).__name__ == "TEDotProductAttention" for m in model.modules()):
        message = (
            "packed rows need megatron's local attention (a block-diagonal mask); this model runs "
            "Transformer Engine's, whose packed format (THD) hpcrl does not wire: set it false"
        )
        raise ConfigError(Problem(message, key="optim.pack_sequences"))


def check_first_tokens(attention_mask_BT: torch.Tensor, response_mask_BT: torch.Tensor) -> None:
    """Refuse a batch whose response starts a sequence: packed, that token's log-prob would come from the
    previous sequence (module doc)."""
    real_BT = attention_mask_BT.bool()
    first_BT = real_BT.clone()
    first_BT[:, 1:] &= ~real_BT[:, :-1]
    if bool((first_BT & response_mask_BT.bool()).any()):
        rows = (first_BT & response_mask_BT.bool()).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(f"rows {rows[:5]}: a response token starts its sequence, so it cannot be packed")


def _check_contiguous(keep_BT: torch.Tensor, lengths: list[int], starts: list[int]) -> None:
    for b, (n, start) in enumerate(zip(lengths, starts, strict=True)):
        if n and not bool(keep_BT[b, start : start + n].all()):
            raise ValueError(f"row {b}: its real tokens are not contiguous, so it cannot be packed")


def row_width(lengths: list[int], hidden_size: int, cap: int, multiples: int = 4) -> int:
    """The packed rows' width: among m x the longest sequence (m = 1..`multiples`, at most `cap`), the one
    whose first-fit-decreasing rows cost the least forward FLOPs per layer, R x (24 W h^2 + 4 W^2 h)
    (Narayanan et al. 2021, §5.1; the W^2 term is attention, which a dense block mask computes in full).
    Rows as wide as the longest sequence leave gaps the size of a long sequence's remainder; wider rows
    fill better but pay more attention, so the best width grows with the model."""
    longest = max(max(lengths), 1)
    best = None
    for width in sorted({min(m * longest, cap) for m in range(1, multiples + 1)} | {longest}):
        rows = len(fill_rows(lengths, width))
        cost = rows * (24 * width * hidden_size**2 + 4 * width**2 * hidden_size)
        if best is None or cost < best[0]:
            best = (cost, width)
    return best[1]


def packed_micro_batches(
    attention_mask_BT: torch.Tensor, *, micro_batch_size: int, max_tokens: int | None, hidden_size: int
) -> list[tuple[torch.Tensor, PackedRows]]:
    """(row indices, packed layout of those rows) per micro-batch of a DP rank's batch, rows `row_width`
    wide for a model of `hidden_size`, never wider than the padded rows: a micro-batch then holds no
    more rows, tokens or attention scores (rows x width^2) than the padded one, so the memory planner's
    bound (hpcrl.plan.memory.micro_batch) holds for packed rows too.

    Without a token budget: micro_batch_size consecutive sequences each. With `max_tokens`: every
    sequence into rows of width W, then max_tokens // W rows per micro-batch, fullest rows first, each
    micro-batch as wide as its fullest row, so each computes at most max_tokens tokens (the config rule
    keeps the longest sequence <= max_tokens)."""
    lengths = attention_mask_BT.bool().sum(dim=1).tolist()
    padded_width = attention_mask_BT.shape[1]
    if max_tokens is None:
        out = []
        for start in range(0, len(lengths), micro_batch_size):
            index = torch.arange(start, min(start + micro_batch_size, len(lengths)))
            chunk = lengths[start : start + micro_batch_size]
            width = row_width(chunk, hidden_size, cap=min(max(sum(chunk), 1), padded_width))
            out.append((index, _packed(attention_mask_BT[index], fill_rows(chunk, width), chunk)))
        return out
    width = row_width(lengths, hidden_size, cap=min(max_tokens, padded_width))
    rows = fill_rows(lengths, width)
    rows.sort(key=lambda row: (-sum(lengths[b] for b in row), row[0]))
    per_micro_batch = max(1, max_tokens // width)
    out = []
    for first in range(0, len(rows), per_micro_batch):
        group = rows[first : first + per_micro_batch]
        index = sorted(b for row in group for b in row)
        local = {b: i for i, b in enumerate(index)}
        local_rows = [[local[b] for b in row] for row in group]
        out.append(
            (
                torch.tensor(index, dtype=torch.long),
                _packed(attention_mask_BT[index], local_rows, [lengths[b] for b in index]),
            )
        )
    return out


def _packed(attention_mask_BT: torch.Tensor, rows: list[list[int]], lengths: list[int]) -> PackedRows:
    """`rows` as wide as the fullest of them (a micro-batch of the least-filled rows gets narrower)."""
    width = max(max(sum(lengths[b] for b in row) for row in rows), 1)
    return PackedRows.of(attention_mask_BT, rows, width=width)
