"""Row-wise batches walked by their fields (hpcrl.rows): selecting, concatenating and padding reach every
field, nested batches and dict entries included, and agree with each other."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.rows import concat_rows, pad_columns, select_rows


@dataclass
class Inner:
    ids_BT: torch.Tensor
    mask_BT: torch.Tensor


@dataclass
class Outer:
    names: list[str]
    inner: Inner
    scores_B: torch.Tensor | None = None
    texts: list[str] = field(default_factory=list)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


def _batch(rows: int, width: int = 3, offset: int = 0, scored: bool = True) -> Outer:
    base = torch.arange(offset, offset + rows)
    return Outer(
        names=[f"row{offset + i}" for i in range(rows)],
        inner=Inner(base[:, None] * 10 + torch.arange(width), torch.ones(rows, width)),
        scores_B=base.float() if scored else None,
        extras={"values_BT": base[:, None].float().expand(rows, width).clone()},
    )


def _same(a: Outer, b: Outer) -> bool:
    return (
        a.names == b.names
        and a.texts == b.texts
        and torch.equal(a.inner.ids_BT, b.inner.ids_BT)
        and torch.equal(a.inner.mask_BT, b.inner.mask_BT)
        and (a.scores_B is None) == (b.scores_B is None)
        and (a.scores_B is None or torch.equal(a.scores_B, b.scores_B))
        and a.extras.keys() == b.extras.keys()
        and all(torch.equal(a.extras[k], b.extras[k]) for k in a.extras)
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 7), max_size=12), st.booleans())
def test_selected_rows_are_the_rows_of_every_field(picked, scored):
    batch = _batch(8, scored=scored)
    out = select_rows(batch, torch.tensor(picked, dtype=torch.long))
    assert out.names == [f"row{i}" for i in picked]
    assert out.inner.ids_BT.tolist() == [[i * 10 + j for j in range(3)] for i in picked]
    assert out.extras["values_BT"][:, 0].tolist() == [float(i) for i in picked]
    assert out.texts == []  # not filled: stays empty
    assert (out.scores_B is None) == (not scored)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_concatenated_parts_are_the_whole_batch_selected_in_order(sizes):
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    parts = [_batch(n, offset=o) for n, o in zip(sizes, offsets, strict=True)]
    whole = _batch(sum(sizes))
    assert _same(concat_rows(parts), whole)
    split = [select_rows(whole, torch.arange(o, o + n)) for n, o in zip(sizes, offsets, strict=True)]
    assert _same(concat_rows(split), whole)


def test_padding_widens_every_two_dimensional_field_with_its_own_value():
    batch = _batch(2, width=3).inner
    out = pad_columns(batch, 5, {"ids_BT": -1})
    assert out.ids_BT[:, 3:].tolist() == [[-1, -1], [-1, -1]]
    assert out.mask_BT[:, 3:].tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert torch.equal(out.ids_BT[:, :3], batch.ids_BT)
    assert pad_columns(batch, 2).ids_BT.shape == (2, 3)  # already wider: unchanged


def test_a_field_that_is_not_row_wise_is_refused():
    @dataclass
    class Odd:
        count: int

    with pytest.raises(TypeError, match="not a row-wise value: int"):
        select_rows(Odd(3), torch.tensor([0]))
