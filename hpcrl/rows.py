"""Row-wise batches: dataclasses whose every field holds one entry per sequence (row), walked by
`dataclasses.fields`, so a field added to a batch (a packed-sequence offset, an environment's turn
count) is selected, concatenated and padded with the rest instead of being listed in every place that
builds one.

A field's value is, row-wise:
    torch.Tensor      rows along dim 0
    list              one item per row; an empty list is a field not filled yet (it stays empty)
    dict              str -> any of these, each row-wise (extra tensors filled by the dataflow)
    dataclass         another row-wise batch (GenerationOutput inside Experience)
    None              a field not filled yet (it stays None)
Shape legend: B = rows, T = columns (tokens).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

Batch = TypeVar("Batch")


def select_rows(batch: Batch, index_B: torch.Tensor) -> Batch:
    """The rows `index_B` (1-D long) of every field, in that order."""
    picked = index_B.tolist()

    def pick(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, torch.Tensor):
            return value[index_B]
        if isinstance(value, list):
            return [value[i] for i in picked] if value else []
        if isinstance(value, dict):
            return {key: pick(item) for key, item in value.items()}
        if dataclasses.is_dataclass(value):
            return select_rows(value, index_B)
        raise TypeError(f"not a row-wise value: {type(value).__name__}")

    return type(batch)(**{f.name: pick(getattr(batch, f.name)) for f in dataclasses.fields(batch)})


def concat_rows(parts: list[Batch]) -> Batch:
    """One batch of the rows of `parts` in order (every tensor field already shares its trailing shape;
    dict fields take the first part's keys)."""
    if len(parts) == 1:
        return parts[0]

    def join(values: list[Any]) -> Any:
        first = values[0]
        if first is None:
            return None
        if isinstance(first, torch.Tensor):
            return torch.cat(values)
        if isinstance(first, list):
            return [item for value in values for item in value]
        if isinstance(first, dict):
            return {key: join([value[key] for value in values]) for key in first}
        if dataclasses.is_dataclass(first):
            return concat_rows(values)
        raise TypeError(f"not a row-wise value: {type(first).__name__}")

    names = [f.name for f in dataclasses.fields(parts[0])]
    return type(parts[0])(**{name: join([getattr(p, name) for p in parts]) for name in names})


def pad_columns(batch: Batch, width: int, pad_values: dict[str, int | float] | None = None) -> Batch:
    """Every [B, T] tensor field right padded to `width` columns, with `pad_values[field name]` (0 by
    default); the batch itself when it is that wide already."""
    pad_values = pad_values or {}

    def pad(name: str, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[1] < width:
            return F.pad(value, (0, width - value.shape[1]), value=pad_values.get(name, 0))
        return value

    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    return type(batch)(**{name: pad(name, value) for name, value in fields.items()})
