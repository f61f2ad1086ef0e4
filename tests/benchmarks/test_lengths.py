"""benchmarks/lengths.py: its batch has the task's lengths in GRPO's layout, and a small run prints the
issue's line with figures taken from its own records."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks.lengths import SAMPLES, long_tail_batch, main


def test_the_batch_holds_groups_of_one_prompt_with_long_tailed_lengths():
    batch, prompts = long_tail_batch(64)
    lengths = batch.row_lengths()
    assert len(prompts) == len(lengths) == 64
    for g in range(0, 64, SAMPLES):  # a group: one prompt, so one target length
        assert (
            len(set(lengths[g : g + SAMPLES])) == 1 and len({tuple(p) for p in prompts[g : g + SAMPLES]}) == 1
        )
    # real tokens contiguous: left-padded prompt, then the response (+ EOS), then padding
    mask = batch.attention_mask_BT
    for row in mask:
        real = row.nonzero().flatten()
        assert int(real[-1] - real[0]) + 1 == len(real)
    responses = sorted(batch.response_mask_BT.sum(dim=1).tolist())
    assert responses[0] >= 2  # one answer character + EOS at least
    assert responses[-1] > 2 * responses[len(responses) // 2]  # a long tail over the median


@pytest.mark.dist
def test_a_small_run_prints_the_issues_line_from_its_records(tmp_path, capsys):
    args = ["--results-dir", str(tmp_path), "--batch", "32", "--hidden", "32", "--layers", "1", "--reps", "1"]
    assert main([*args, "--max-num-seqs", "4"]) == 0
    out = capsys.readouterr().out
    line = out.strip().splitlines()[-1]
    pattern = (
        r"lengths: train tokens/s ratio=([\d.]+) padding=([\d.]+)%->([\d.]+)% "
        r"dp_imbalance=([\d.]+)->([\d.]+) rollout tokens/s ratio=([\d.]+)"
    )
    match = re.fullmatch(pattern, line)
    assert match, line
    records = {r["metric"]: r for r in map(json.loads, (tmp_path / "lengths.jsonl").read_text().splitlines())}
    train, rollout = records["train_tokens_per_s"], records["rollout_tokens_per_s"]
    assert float(match[1]) == pytest.approx(train["ratio"], abs=0.006)
    assert float(match[6]) == pytest.approx(rollout["ratio"], abs=0.006)
    assert float(match[3]) < float(match[2])  # packing removed padding
    assert float(match[5]) <= float(match[4])  # balancing never makes it worse
    assert rollout["extra"]["generated_tokens"] > 0
    capped = records["rollout_tokens_per_s_capped"]
    above = out.strip().splitlines()[-2]
    assert (
        above == f"lengths: rollout at max_num_seqs=4: continuous/waves tokens/s ratio={capped['ratio']:.2f}"
    )
