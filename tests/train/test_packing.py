"""Packed sequences (optim.pack_sequences, hpcrl.train.packing): the layout's rules (property tests), and
real megatron-core trainers on real gloo ranks whose log-probs, entropies, values, losses and gradients
with packed rows equal the padded computation within 1e-5 (fp32), under every loss_agg, with and
without a token budget, at t=1, t=2, p=2 and d=2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl import cli
from hpcrl.distributed.spawn import run_ranks
from hpcrl.train.packing import (
    PackedRows,
    check_attention_takes_masks,
    check_first_tokens,
    packed_micro_batches,
    row_width,
)
from hpcrl.train.token_budget import fill_rows

LOSS_AGGS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm")
PROMPTS = [2, 5, 3, 4, 1, 5, 2, 3]
RESPONSES = [10, 1, 2, 1, 10, 2, 1, 3]
S = 15


def _mask(spans: list[tuple[int, int]], width: int) -> torch.Tensor:
    mask = torch.zeros(len(spans), width, dtype=torch.bool)
    for b, (start, n) in enumerate(spans):
        mask[b, start : start + n] = True
    return mask


spans = st.integers(1, 24).flatmap(
    lambda width: st.lists(
        st.integers(0, width).flatmap(lambda n: st.tuples(st.integers(0, width - n), st.just(n))),
        min_size=1,
        max_size=12,
    ).map(lambda s: (s, width))
)


@settings(max_examples=200, deadline=None)
@given(spans)
def test_every_real_token_lands_once_and_comes_back(case):
    rows_spans, width = case
    mask = _mask(rows_spans, width)
    packed = PackedRows.of(mask)
    R, W = packed.shape
    assert max(max(n for _, n in rows_spans), 1) == W
    assert packed.real_tokens == int(mask.sum()) <= packed.computed_tokens == R * W
    real = packed.source_BT[mask]
    assert len(set(real.tolist())) == len(real) and bool((packed.source_BT[~mask] == -1).all())
    values = torch.randn(mask.shape) * mask
    assert torch.equal(packed.unpack(packed.pack(values)), values)
    # each sequence is contiguous in one row, in its own order
    for b, (start, n) in enumerate(rows_spans):
        where = packed.source_BT[b, start : start + n]
        assert torch.equal(where, torch.arange(int(where[0]), int(where[0]) + n)) if n else True
        assert n == 0 or int(where[0]) // W == int(where[-1]) // W


@settings(max_examples=100, deadline=None)
@given(spans)
def test_a_token_sees_exactly_its_own_sequence_up_to_itself(case):
    rows_spans, width = case
    packed = PackedRows.of(_mask(rows_spans, width))
    seq = packed.sequence_RW
    allowed = ~packed.attention_mask()[:, 0]
    R, W = packed.shape
    for r in range(R):
        for q in range(W):
            if seq[r, q] < 0:
                assert allowed[r, q].nonzero().flatten().tolist() == [q]  # padding: itself only
            else:
                want = [k for k in range(q + 1) if seq[r, k] == seq[r, q]]
                assert allowed[r, q].nonzero().flatten().tolist() == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=40), st.integers(0, 40))
def test_rows_never_overflow_and_hold_every_sequence(lengths, extra):
    capacity = max(lengths) + extra or 1
    rows = fill_rows(lengths, capacity)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= capacity for row in rows)
    # first-fit decreasing leaves at most one row at most half full (else two would have merged)
    assert (
        sum(sum(lengths[i] for i in row) * 2 <= capacity for row in rows if any(lengths[i] for i in row)) <= 1
    )


def test_a_response_that_starts_its_sequence_is_refused():
    attention = torch.tensor([[False, True, True], [True, True, True]])
    response = torch.tensor([[False, True, True], [False, False, True]])  # row 0: no prompt before it
    with pytest.raises(ValueError, match=r"rows \[0\]: a response token starts its sequence"):
        check_first_tokens(attention, response)
    check_first_tokens(attention, torch.tensor([[False, False, True], [False, True, True]]))


def test_transformer_engines_attention_is_refused_naming_the_key():
    """A stand-in named as Transformer Engine's attention class (TE needs a GPU, not here): its mask type
    would override the block mask, so packing refuses the model instead of attending across sequences."""
    from hpcrl.errors import ConfigError

    class TEDotProductAttention(torch.nn.Module):  # noqa: N801 - the name is what is checked
        pass

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), TEDotProductAttention())
    with pytest.raises(ConfigError, match="optim.pack_sequences"):
        check_attention_takes_masks(model)
    check_attention_takes_masks(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_a_sequence_with_a_hole_is_refused():
    mask = torch.tensor([[True, False, True, True]])
    with pytest.raises(ValueError, match="row 0: its real tokens are not contiguous"):
        PackedRows.of(mask)


@settings(max_examples=100, deadline=None)
@given(spans, st.integers(1, 64), st.integers(1, 5), st.sampled_from([1, 64, 4096]))
def test_a_token_budget_bounds_every_micro_batch(case, budget, micro_batch_size, hidden):
    rows_spans, width = case
    mask = _mask(rows_spans, width)
    longest = max(n for _, n in rows_spans)
    budget = max(budget, longest, 1)
    for max_tokens in (None, budget):
        cut = packed_micro_batches(
            mask, micro_batch_size=micro_batch_size, max_tokens=max_tokens, hidden_size=hidden
        )
        assert sorted(int(i) for index, _ in cut for i in index) == list(range(len(rows_spans)))
        for index, packed in cut:
            assert packed.real_tokens == int(mask[index].sum())
            assert packed.shape[1] <= width and packed.shape[0] <= len(index)  # never beyond padded rows
            if max_tokens is not None:
                assert packed.computed_tokens <= max_tokens
            else:
                assert len(index) <= micro_batch_size


def test_rows_get_wider_than_the_longest_sequence_where_that_costs_less():
    lengths = [40, 21, 21, 21, 21]  # at width 40 each 21 sits alone: 5 rows, 200 computed for 124 real
    assert row_width(lengths, hidden_size=4096, cap=1000) == 80  # 2 rows: 40+21 | 21+21+21
    assert len(fill_rows(lengths, 80)) == 2
    assert row_width(lengths, hidden_size=1, cap=1000) == 40  # attention (W^2) dominates a tiny model
    assert row_width(lengths, hidden_size=4096, cap=50) == 50  # the budget caps it: 40 | 21+21 | 21+21


def test_long_tailed_rows_pack_with_little_padding():
    lengths = [40, 3, 5, 2, 30, 4, 6, 8, 12, 3, 2, 25]
    mask = _mask([(0, n) for n in lengths], 40)
    packed = PackedRows.of(mask)
    assert packed.shape == (4, 40)  # 140 real tokens in 160 computed, vs 12 x 40 = 480 padded
    assert packed.real_tokens == sum(lengths) == 140


def ragged_batch(vocab: int):
    """8 rows of 15 columns: prompts left padded to 5 columns, responses of 1..10 right padded; real
    lengths 12, 6, 5, 5, 11, 7, 3, 6, so micro-batches of 3 rows share packed rows (12 | 6+5, ...)."""
    from tests.train._batches import ragged_batch as build

    return build(vocab, PROMPTS, RESPONSES, width=S, seed=5)


def packed_and_padded(rank: int, world: int, tensor: int, pipeline: int, data: int, aggs: tuple) -> dict:
    """Policy and critic of layout t-p-d loaded with the same random weights: forward outputs, update
    loss and full gradients, padded and packed (micro-batches of 3 rows, and a budget of 32 tokens)."""
    from hpcrl.algorithm.config import AlgorithmConfig
    from hpcrl.rl.objectives import policy_loss_fn, value_loss_fn
    from hpcrl.train.config import OptimizerConfig
    from hpcrl.train.model import build_train_groups, gather_full_state_dict, load_full_state_dict
    from hpcrl.train.trainer import build_policy_trainer, build_value_trainer
    from tests.train._rank_fns import random_full_state_dict, tiny_config

    groups = build_train_groups(tensor, pipeline, data)
    cfg = tiny_config("qwen2")
    batch = ragged_batch(cfg.vocab_size).dp_shard(groups.dp_rank, groups.data)
    full = random_full_state_dict(cfg, seed=11)
    full["value_head.weight"] = 0.3 * torch.randn(
        1, cfg.hidden_size, generator=torch.Generator().manual_seed(3)
    )
    out = {}
    for agg in aggs:
        algo = AlgorithmConfig(loss_agg=agg, entropy_coef=0.01)
        for kind, build, loss in (
            ("policy", build_policy_trainer, policy_loss_fn(algo, 8)),
            ("value", build_value_trainer, value_loss_fn(algo, 8)),
        ):
            for mode in ("padded", "packed", "packed_budget"):
                optim = OptimizerConfig(
                    lr=0.0,
                    grad_clip=0,
                    micro_batch_size=3,
                    pack_sequences=mode != "padded",
                    max_tokens_per_micro_batch=32 if mode == "packed_budget" else None,
                )
                trainer = build(cfg, optim, groups)
                load_full_state_dict(trainer.model, full, cfg, groups)
                forward = trainer.forward(batch).tensors()
                metrics = trainer.update(batch, loss)
                grads = gather_full_state_dict(trainer.model, cfg, groups, grads=True)
                out[(agg, kind, mode)] = {"forward": forward, "metrics": metrics, "grads": grads}
    return out


LAYOUTS = {
    "t1": (1, 1, 1, LOSS_AGGS),
    "t2": (2, 1, 1, ("seq_mean_token_mean",)),
    "p2": (1, 2, 1, ("token_mean",)),
    "d2": (1, 1, 2, ("seq_mean_token_sum_norm",)),
}


@pytest.mark.dist
@pytest.mark.parametrize("layout", LAYOUTS)
def test_packed_rows_compute_what_padded_rows_do(layout):
    tensor, pipeline, data, aggs = LAYOUTS[layout]
    ranks = run_ranks(
        packed_and_padded, tensor * pipeline * data, tensor, pipeline, data, aggs, timeout_s=600
    )
    # outputs are defined where token t and its predecessor are real (a padded row's other columns read
    # padding, a packed row's read another sequence or are 0): every response token is such a token
    attention = ragged_batch(32).attention_mask_BT
    defined = torch.zeros_like(attention)
    defined[:, 1:] = attention[:, 1:] & attention[:, :-1]
    for rank, result in enumerate(ranks):
        rows = defined.chunk(data)[rank % data]  # d=2 runs on 2 ranks, t=2 and p=2 on one DP rank
        for agg in aggs:
            for kind in ("policy", "value"):
                ref = result[(agg, kind, "padded")]
                for mode in ("packed", "packed_budget"):
                    got = result[(agg, kind, mode)]
                    for name, want in ref["forward"].items():
                        diff = float((got["forward"][name] - want)[rows].abs().max())
                        assert diff <= 1e-5, (layout, agg, kind, mode, name, diff)
                    assert got["metrics"]["loss"] == pytest.approx(ref["metrics"]["loss"], rel=1e-5, abs=1e-6)
                    for name, g in ref["grads"].items():
                        scale = g.abs().max().clamp(min=1e-12)
                        assert float((got["grads"][name] - g).abs().max() / scale) <= 1e-5, (layout, name)
                    assert got["metrics"]["real_tokens"] == ref["metrics"]["real_tokens"]
                    padding = (ref["metrics"]["padding_fraction"], got["metrics"]["padding_fraction"])
                    assert padding[1] < padding[0], (layout, padding)
                assert any(float(g.abs().max()) > 0 for g in ref["grads"].values())


REPO = Path(__file__).resolve().parents[2]


def _run(capsys, tmp_path: Path, template: str, *overrides: str) -> list[dict]:
    capsys.readouterr()
    argv = ["run", str(REPO / "templates" / template), "--run_root", str(tmp_path / "runs")]
    section = template.split("_", 1)[0] if template.startswith(("dpo", "rm", "sft")) else "algorithm"
    argv += [f"--{section}.steps", "2", f"--{section}.eval_every", "0", "--checkpoint.every_steps", "0"]
    argv += ["--logging.tensorboard", "false", "--logging.progress", "false", "--logging.plot", "false"]
    assert cli.main([*argv, *overrides]) == 0
    run_dir = Path(capsys.readouterr().out.splitlines()[0].removeprefix("run dir: "))
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.dist
@pytest.mark.parametrize(
    "template, extra",
    [
        ("grpo_tiny.yaml", []),
        ("grpo_long_tail.yaml", ["--optim.micro_batch_size", "8"]),
        ("grpo_long_tail.yaml", ["--optim.max_tokens_per_micro_batch", "512"]),
    ],
)
def test_a_packed_rl_run_takes_the_padded_runs_first_step(tmp_path, capsys, template, extra):
    padded = _run(capsys, tmp_path, template, *extra)
    packed = _run(capsys, tmp_path, template, *extra, "--optim.pack_sequences", "true")
    assert packed[0]["reward/mean"] == padded[0]["reward/mean"]  # the same samples before any update
    for key in ("actor/loss", "actor/grad_norm"):
        assert packed[0][key] == pytest.approx(padded[0][key], rel=1e-5), key
    # a mean over micro-batches of ~1,000 tokens each, summed in another order (other GEMM shapes)
    assert packed[0]["actor/entropy"] == pytest.approx(padded[0]["actor/entropy"], rel=1e-4)
    assert packed[0]["actor/real_tokens"] == padded[0]["actor/real_tokens"]
    before, after = padded[0]["actor/padding_fraction"], packed[0]["actor/padding_fraction"]
    if template == "grpo_long_tail.yaml":  # lengths vary: packing leaves a fraction of the padding
        assert after < before / 2, (before, after)


@pytest.mark.dist
@pytest.mark.parametrize("template", ["dpo_tiny.yaml", "rm_tiny.yaml", "sft_tiny.yaml"])
def test_a_packed_offline_stage_takes_the_padded_runs_first_step(tmp_path, capsys, template):
    padded = _run(capsys, tmp_path, template)
    packed = _run(capsys, tmp_path, template, "--optim.pack_sequences", "true")
    keys = [k for k in padded[0] if k.endswith(("loss", "grad_norm")) and isinstance(padded[0][k], float)]
    assert keys, sorted(padded[0])
    for key in keys:
        assert packed[0][key] == pytest.approx(padded[0][key], rel=1e-5), key
