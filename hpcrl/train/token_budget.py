"""Micro-batches by token budget (verl's `use_dynamic_bsz`, OpenRLHF's packing budget): a DP rank's share
of an update cut into micro-batches whose computed tokens stay within `optim.max_tokens_per_micro_batch`,
instead of a fixed count of sequences.

A micro-batch computes rows x width tokens, its width being its longest row's last real column (rows are
trimmed on the right; left padding stays, hpcrl's prompts are left padded). First-fit decreasing over
the rows' widths: each row, longest first, joins the first micro-batch that still has room
((rows + 1) x that micro-batch's width <= budget; the first row set the width, later ones are no wider),
else opens a new one. FFD's bin count is at most 11/9 OPT + 6/9 (Dósa 2007) for this monotone cost.
The gradient does not depend on the cut: every loss normalises by the whole batch's counts
(TrainBatch.num_global_seqs / num_global_response_tokens), never by a micro-batch's.
"""

from __future__ import annotations

from collections.abc import Sequence


def pack_by_tokens(widths: Sequence[int], budget: int) -> list[list[int]]:
    """Row indices per micro-batch (each list in ascending order, micro-batches by their first row); a
    row wider than `budget` gets a micro-batch of its own (the config rule keeps that from happening)."""
    if budget < 1:
        raise ValueError(f"token budget must be >= 1, got {budget}")
    bins: list[list[int]] = []
    bin_width: list[int] = []
    for row in sorted(range(len(widths)), key=lambda i: (-widths[i], i)):
        for b, width in enumerate(bin_width):
            if (len(bins[b]) + 1) * width <= budget:
                bins[b].append(row)
                break
        else:
            bins.append([row])
            bin_width.append(widths[row])
    return sorted((sorted(rows) for rows in bins), key=lambda rows: rows[0])


def fill_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Sequence indices per packed row (each ascending, rows by their first sequence): first-fit
    decreasing by length into rows of `capacity` tokens (each sequence, longest first, into the first row
    with room, else a new row), at most 11/9 OPT + 6/9 rows (Dósa 2007). A sequence longer than
    `capacity` is an error (the caller sizes the rows)."""
    if any(length > capacity for length in lengths):
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit a row of {capacity}")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return sorted((sorted(row) for row in rows), key=lambda row: row[0])


def computed_tokens(widths: Sequence[int], bins: list[list[int]]) -> int:
    """Tokens the micro-batches compute: sum of rows x width (the padding included)."""
    return sum(len(rows) * max(widths[i] for i in rows) for rows in bins)


def balance_over_ranks(widths: Sequence[int], ranks: int) -> list[list[int]]:
    """Row indices per DP rank (each ascending) so that the ranks' token sums are close: longest
    processing time first (Graham 1969: the largest sum is at most 4/3 - 1/(3 ranks) of the optimum),
    each row to the rank with the fewest tokens so far (then the fewest rows, then the lowest rank).
    verl's `balance_batch` does this with Karmarkar-Karp; LPT is within a few % on RL batches."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    tokens, parts = [0] * ranks, [[] for _ in range(ranks)]
    for row in sorted(range(len(widths)), key=lambda i: (-widths[i], i)):
        rank = min(range(ranks), key=lambda r: (tokens[r], len(parts[r]), r))
        parts[rank].append(row)
        tokens[rank] += widths[row]
    return [sorted(rows) for rows in parts]


def imbalance(widths: Sequence[int], parts: list[list[int]]) -> float:
    """max / mean of the ranks' token sums (1.0 = perfectly balanced)."""
    sums = [sum(widths[i] for i in rows) for rows in parts]
    mean = sum(sums) / len(sums)
    return max(sums) / mean if mean else 1.0
