"""The batch a training worker consumes: token ids, masks, and whatever per-sequence tensors a loss needs.

Shapes: B sequences, T tokens (prompt + response, padded to T).

Public: `TrainBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from hpcrl.train.token_budget import pack_by_tokens


@dataclass
class TrainBatch:
    """One DP rank's batch (or a micro-batch of it). The RL driver fills the first four fields.

    Positions: megatron's RoPE always uses positions 0..T-1 and ignores position_ids (docs/FACTS.md). Left
    padding is still exact (RoPE depends on relative positions only), so `position_ids_BT`, when given,
    is only checked: each row's positions on real tokens must be consecutive. Rows hold one sequence
    each; the trainer packs them itself when asked (hpcrl.train.packing).
    """

    input_ids_BT: torch.Tensor
    """Token ids, int64."""
    attention_mask_BT: torch.Tensor
    """True (or 1) on real tokens, False on padding (HF convention; converted for megatron inside)."""
    response_mask_BT: torch.Tensor
    """True on the tokens the loss counts (generated response tokens); aligned to tokens."""
    position_ids_BT: torch.Tensor | None = None
    """Optional HF-style positions; validated, not used (see class doc)."""
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-sequence tensors for the loss (old_logprobs_BT, advantages_BT, returns_BT, ref_logprobs_BT, ...);
    each has B rows and is sliced with the batch."""
    num_global_seqs: int = 0
    """Sequences in the whole update batch across all DP ranks; set by the trainer before loss_fn runs."""
    num_global_response_tokens: int = 0
    """Response tokens (response_mask sum) in the whole update batch across all DP ranks; set by the trainer."""

    def __post_init__(self) -> None:
        self.validate()

    def __len__(self) -> int:
        return self.input_ids_BT.shape[0]

    def validate(self) -> None:
        """Raise ValueError naming the field when shapes or dtypes disagree."""
        if self.input_ids_BT.dim() != 2 or self.input_ids_BT.dtype != torch.long:
            raise ValueError(
                f"input_ids_BT must be a [B, T] int64 tensor, got {self.input_ids_BT.dtype} "
                f"{tuple(self.input_ids_BT.shape)}"
            )
        shape = self.input_ids_BT.shape
        for name in ("attention_mask_BT", "response_mask_BT", "position_ids_BT"):
            value = getattr(self, name)
            if value is not None and value.shape != shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, input_ids_BT has {tuple(shape)}")
        for name, value in self.extras.items():
            if value.shape[:1] != shape[:1]:
                raise ValueError(f"extras[{name!r}] has {value.shape[0]} rows, the batch has {shape[0]}")
        if self.position_ids_BT is not None:
            keep = self.attention_mask_BT.bool()
            steps = self.position_ids_BT[:, 1:] - self.position_ids_BT[:, :-1]
            both = keep[:, 1:] & keep[:, :-1]
            if bool((both & (steps != 1)).any()):
                raise ValueError(
                    "position_ids_BT: positions of real tokens must be consecutive in each row "
                    "(one sequence per row: the trainer packs rows itself, optim.pack_sequences)"
                )

    def token_mean(self, x_BT: torch.Tensor) -> torch.Tensor:
        """This micro-batch's share of the token mean of `x_BT` over all response tokens of the global
        batch: sum(x * response_mask) / num_global_response_tokens (use as a loss contribution)."""
        if self.num_global_response_tokens <= 0:
            raise ValueError("num_global_response_tokens is not set (the trainer sets it in update())")
        return (x_BT * self.response_mask_BT).sum() / self.num_global_response_tokens

    def seq_mean(self, x_B: torch.Tensor) -> torch.Tensor:
        """This micro-batch's share of the mean of per-sequence `x_B` over the global batch."""
        if self.num_global_seqs <= 0:
            raise ValueError("num_global_seqs is not set (the trainer sets it in update())")
        return x_B.sum() / self.num_global_seqs

    def slice(self, start: int, stop: int) -> TrainBatch:
        """Rows [start, stop), as views (global counts kept)."""
        return self._rows(slice(start, stop))

    def dp_shard(self, dp_rank: int, dp_size: int) -> TrainBatch:
        """DP rank `dp_rank`'s contiguous share of a global batch (B must divide by dp_size)."""
        if len(self) % dp_size:
            raise ValueError(f"batch of {len(self)} sequences does not split evenly over {dp_size} DP ranks")
        share = len(self) // dp_size
        return self.slice(dp_rank * share, (dp_rank + 1) * share)

    def micro_batches(self, micro_batch_size: int) -> list[TrainBatch]:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        return [
            self.slice(i, min(i + micro_batch_size, len(self))) for i in range(0, len(self), micro_batch_size)
        ]

    def token_micro_batches(self, max_tokens: int) -> list[TrainBatch]:
        """Micro-batches of at most `max_tokens` computed tokens each (hpcrl.train.token_budget), each
        trimmed on the right to its longest row (global counts kept)."""
        widths = self.row_widths()
        out = []
        for rows in pack_by_tokens(widths, max_tokens):
            width = max(widths[i] for i in rows)
            out.append(self.select(torch.tensor(rows, dtype=torch.long)).columns(width))
        return out

    def row_widths(self) -> list[int]:
        """Each row's last real column + 1 (what it computes when trimmed on the right)."""
        real_BT = self.attention_mask_BT.bool()
        columns_T = torch.arange(1, real_BT.shape[1] + 1)
        return (real_BT * columns_T).amax(dim=1).clamp(min=1).tolist()

    def row_lengths(self) -> list[int]:
        """Each row's real tokens (what it computes when packed, hpcrl.train.packing)."""
        return self.attention_mask_BT.bool().sum(dim=1).tolist()

    def select(self, index_B: torch.Tensor) -> TrainBatch:
        """Rows `index_B` (global counts kept)."""
        return self._rows(index_B)

    def _rows(self, rows: slice | torch.Tensor) -> TrainBatch:
        return self._map(lambda t: t[rows])

    def columns(self, width: int) -> TrainBatch:
        """The first `width` columns of every [B, T] tensor ([B] extras unchanged; global counts kept)."""
        return self._map(lambda t: t[:, :width] if t.dim() == 2 else t)

    def to(self, device: torch.device) -> TrainBatch:
        return self._map(lambda t: t.to(device))

    def _map(self, fn) -> TrainBatch:
        """`fn` applied to every tensor of the batch (the fields and the extras; global counts kept)."""
        return replace(
            self,
            input_ids_BT=fn(self.input_ids_BT),
            attention_mask_BT=fn(self.attention_mask_BT),
            response_mask_BT=fn(self.response_mask_BT),
            position_ids_BT=None if self.position_ids_BT is None else fn(self.position_ids_BT),
            extras={k: fn(v) for k, v in self.extras.items()},
        )
