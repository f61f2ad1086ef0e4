"""Multi-rank save (real gloo ranks) and reshard on load: (t=2,p=1,d=2) -> (t=1,p=2,d=1) and (t=4,p=1,d=1)."""

from __future__ import annotations

import pytest

from hpcrl.ckpt.manifest import read_manifest
from hpcrl.ckpt.partition import layout_problems, layout_specs, parse_layout
from hpcrl.ckpt.verify import dataset_ranges
from hpcrl.distributed.spawn import run_ranks
from tests.ckpt._model import global_tensors, rank_specs
from tests.ckpt._rank_fns import (
    async_save_two_ranks,
    fallback_when_one_rank_sees_corruption,
    save_then_reshard_load,
)

pytestmark = pytest.mark.dist


# 4 spawned ranks import torch on 2 cores: 10-30 s for the shared fixture
slow_fixture = pytest.mark.slow


@pytest.fixture(scope="module")
def saved_t2_d2(tmp_path_factory):
    root = tmp_path_factory.mktemp("t2d2")
    results = run_ranks(save_then_reshard_load, 4, str(root), (2, 1), [(1, 2, 1), (4, 1, 1)])
    return root, results


@slow_fixture
def test_replicated_tensors_and_shards_are_written_once_by_the_lowest_rank(saved_t2_d2):
    root, _ = saved_t2_d2
    step = root / "step_00000005"
    manifest = read_manifest(step)
    # d=2: ranks 2 and 3 only hold replicas of ranks 0 and 1, so they write no file
    assert sorted(p.name for p in step.glob("*.h5")) == ["rank_00000.h5", "rank_00001.h5"]
    assert [s.file for s in manifest.tensors["norm"].shards] == ["rank_00000.h5"]
    assert [s.file for s in manifest.tensors["step_count"].shards] == ["rank_00000.h5"]
    assert [(s.file, s.offset) for s in manifest.tensors["embedding"].shards] == [
        ("rank_00000.h5", (0, 0)),
        ("rank_00001.h5", (16, 0)),
    ]
    unique_bytes = sum(t.numel() * t.element_size() for t in global_tensors(7).values())
    stored = sum(hi - lo for f in manifest.files for lo, hi, _ in dataset_ranges(manifest, f).values())
    assert stored == unique_bytes
    assert manifest.world_size == 4 and manifest.layout == {"t": 2, "p": 1, "d": 2}
    assert sorted(manifest.rng) == ["0", "1", "2", "3"]


@slow_fixture
@pytest.mark.parametrize("layout", [(1, 2, 1), (4, 1, 1)])
def test_reshard_on_load_is_bitwise_and_reads_exactly_the_new_shard_bytes(saved_t2_d2, layout):
    _, results = saved_t2_d2
    ranks = [r[layout] for r in results if layout in r]
    assert len(ranks) == layout[0] * layout[1] * layout[2]
    for got in ranks:
        assert got["equal"]
        assert got["bytes_read"] == got["shard_bytes"]
        assert got["rng_continues"]
        assert got["cursor"] == {"epoch": 0, "index": 40}
    assert sum(g["bytes_read"] for g in ranks) >= sum(
        t.numel() * t.element_size() for t in global_tensors(7).values()
    )


@slow_fixture
def test_layout_specs_from_the_manifest_match_the_hand_written_split(saved_t2_d2):
    root, _ = saved_t2_d2
    manifest = read_manifest(root / "step_00000005")
    tensors = global_tensors(7)
    for t, p in [(1, 2), (4, 1), (2, 2)]:
        layout = parse_layout(f"t={t},p={p},d=1")
        for rank in range(t * p):
            by_name = {s.name: s for s in layout_specs(manifest, layout, rank)}
            for spec in rank_specs(tensors, rank, t, p):
                got = by_name[spec.name]
                assert (got.global_offset, got.local_shape) == (spec.global_offset, spec.local_shape)
    assert layout_problems(manifest, parse_layout("t=4,p=1,d=1")) == []
    problems = layout_problems(manifest, parse_layout("t=3,p=1,d=1"))
    assert problems[0].startswith("tensor 'embedding': dim 0 of size 32 does not divide by tp size 3")


def test_ranks_agree_to_fall_back_when_only_one_rank_sees_corruption(tmp_path):
    results = run_ranks(fallback_when_one_rank_sees_corruption, 2, str(tmp_path))
    # every rank's error says which rank rejected it and why, not just that another rank said no
    for got in results:
        assert got["strict_error"].startswith("rank 1: ")
        assert "rank_00001.h5: checksum mismatch" in got["strict_error"]
        assert "tensor " in got["strict_error"]
    for got in results:
        assert got["step"] == 1 and got["equal"] and len(got["skipped"]) == 1


def test_async_saves_of_two_ranks_commit_the_snapshot_not_the_later_updates(tmp_path):
    rank0, rank1 = run_ranks(async_save_two_ranks, 2, str(tmp_path))
    assert {k: rank0[k] for k in (1, 2)} == {k: rank1[k] for k in (1, 2)} == {1: True, 2: True}
    # step 3: rank 1 wrote a saved tensor without fencing; both ranks report it, nothing is committed
    assert "rank 1 failed to write step 3" in rank0["error"]
    assert f"tensor {rank1['written']!r} was written in place" in rank1["error"]
    assert (tmp_path / "latest").read_text().strip() == "step_00000002"
    assert not (tmp_path / "step_00000003").exists()
