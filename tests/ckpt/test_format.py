"""Single-process save/load: format, dtypes, manifest contents, partial reads, shard rules, no pickle."""

from __future__ import annotations

import json
import os
import pickle
import random

import numpy as np
import pytest
import torch

from hpcrl import __version__
from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.load import CheckpointMismatch, can_load, load_checkpoint
from hpcrl.ckpt.manifest import read_manifest
from hpcrl.ckpt.save_plan import assign_owners
from hpcrl.ckpt.shards import ShardedTensor, ShardError, ShardSpec
from hpcrl.ckpt.state import RunState, capture_rng, restore_rng
from tests.ckpt._model import expected_local, global_tensors, rank_shards, rank_specs


def _save_whole(root, tensors, step=3, **state):
    ck = Checkpointer(root, async_save=False)
    shards = [ShardedTensor.whole(name, t) for name, t in tensors.items()]
    ck.save(step, shards, RunState(step=step, **state), layout={"t": 1, "p": 1, "d": 1})
    return ck


def test_round_trip_of_every_dtype_and_a_scalar_and_an_empty_tensor(tmp_path):
    tensors = {
        "f32": torch.randn(5, 7),
        "f16": torch.randn(3).half(),
        "bf16": torch.randn(4, 4).bfloat16(),
        "f64": torch.randn(2, dtype=torch.float64),
        "i64": torch.arange(6).reshape(2, 3),
        "u8": torch.arange(9, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "f8": torch.randn(4).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
    }
    _save_whole(tmp_path, tensors)
    specs = [ShardedTensor.whole(n, t).spec for n, t in tensors.items()]
    loaded = load_checkpoint(tmp_path, specs)
    for name, tensor in tensors.items():
        got = loaded.tensors[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(
            got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
            tensor.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else tensor,
        ), name


def test_manifest_holds_state_rng_version_and_shard_table(tmp_path):
    tensors = global_tensors(0)
    _save_whole(
        tmp_path,
        tensors,
        data_cursor={"epoch": 1, "index": 17, "seed": 5},
        algorithm_state={"kl_coef": 0.02},
        run_id="run-a",
        tracker_run_id="tb-9",
        restart_count=2,
    )
    manifest = json.loads((tmp_path / "step_00000003" / "manifest.json").read_text())
    assert manifest["hpcrl_version"] == __version__ and manifest["step"] == 3
    assert manifest["state"] == {
        "step": 3,
        "data_cursor": {"epoch": 1, "index": 17, "seed": 5},
        "algorithm_state": {"kl_coef": 0.02},
        "run_id": "run-a",
        "tracker_run_id": "tb-9",
        "restart_count": 2,
    }
    assert set(manifest["rng"]["0"]) >= {"python", "numpy", "torch"}
    assert manifest["tensors"]["qkv"]["global_shape"] == [4, 48, 16]
    assert manifest["tensors"]["qkv"]["dtype"] == "bfloat16"
    assert manifest["tensors"]["qkv"]["shards"][0]["file"] == "rank_00000.h5"
    assert len(manifest["model_fingerprint"]) == 64
    assert (tmp_path / "latest").read_text().strip() == "step_00000003"


def test_rng_states_round_trip_as_json():
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    state = json.loads(json.dumps(capture_rng()))
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    restore_rng(state)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]


def test_partial_load_reads_only_the_requested_hyperslab(tmp_path):
    tensors = global_tensors(1)
    _save_whole(tmp_path, tensors)
    specs = rank_specs(tensors, rank=1, t=2, p=2)  # a quarter-ish of each split tensor
    loaded = load_checkpoint(tmp_path, specs)
    for spec in specs:
        assert torch.equal(loaded.tensors[spec.name], expected_local(tensors, spec))
    assert loaded.bytes_read == sum(s.nbytes for s in specs)
    assert loaded.bytes_read < sum(t.numel() * t.element_size() for t in tensors.values()) / 2


def test_load_never_unpickles(tmp_path, monkeypatch):
    tensors = global_tensors(2)
    _save_whole(tmp_path, tensors)

    def refuse(*args, **kwargs):
        raise AssertionError("pickle used on a load path")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    loaded = load_checkpoint(tmp_path, rank_specs(tensors, 0, 1, 1))
    restore_rng(loaded.rng)
    assert torch.equal(loaded.tensors["qkv"], tensors["qkv"])


def test_loading_under_another_model_names_the_first_mismatch(tmp_path):
    tensors = global_tensors(3)
    _save_whole(tmp_path, tensors)
    specs = rank_specs(tensors, 0, 1, 1)
    specs[1] = ShardSpec("qkv", (4, 48, 32), (0, 0, 0), (4, 48, 32), "bfloat16")
    assert can_load(tmp_path, specs)[0].startswith("tensor 'qkv': global shape (4, 48, 32) requested")
    assert can_load(tmp_path, rank_specs(tensors, 1, 2, 2)) == []
    with pytest.raises(CheckpointMismatch, match=r"tensor 'qkv': global shape \(4, 48, 32\) requested"):
        load_checkpoint(tmp_path, specs)
    with pytest.raises(CheckpointMismatch, match="tensor 'missing': not in the checkpoint"):
        load_checkpoint(tmp_path, [ShardSpec("missing", (2,), (0,), (2,), "float32")])
    with pytest.raises(CheckpointMismatch, match="dtype float32 requested, checkpoint has bfloat16"):
        load_checkpoint(tmp_path, [ShardSpec("norm", (4, 16), (0, 0), (4, 16), "float32")])


@pytest.mark.parametrize(
    ("shards", "message"),
    [
        ([("w", (0, 0), (4, 8))], "cover 32 of 64 elements"),
        ([("w", (0, 0), (4, 8)), ("w", (0, 0), (4, 8))], "appears twice on one rank"),
    ],
)
def test_bad_shard_descriptions_are_refused_before_writing(tmp_path, shards, message):
    described = [ShardedTensor(n, torch.zeros(shape), (8, 8), off) for n, off, shape in shards]
    with pytest.raises(ShardError, match=message):
        Checkpointer(tmp_path, async_save=False).save(1, described, RunState(step=1))
    assert list(tmp_path.iterdir()) == []


def _meta(name, offset, shape, dtype="float32"):
    return {
        "name": name,
        "global_shape": [8, 8],
        "offset": list(offset),
        "shape": list(shape),
        "dtype": dtype,
        "partition": {},
    }


def test_owner_of_a_replicated_shard_is_the_lowest_rank_and_overlaps_are_refused():
    tensors, owners = assign_owners(
        [
            [_meta("w", (0, 0), (4, 8))],
            [_meta("w", (4, 0), (4, 8))],
            [_meta("w", (4, 0), (4, 8))],
            [_meta("w", (0, 0), (4, 8))],
        ]
    )
    assert owners["w"] == [0, 1]
    assert [s.file for s in tensors["w"].shards] == ["rank_00000.h5", "rank_00001.h5"]
    with pytest.raises(ShardError, match=r"tensor 'w': shards \[0:4,0:8\] and \[2:6,0:8\] overlap"):
        assign_owners(
            [[_meta("w", (0, 0), (4, 8))], [_meta("w", (2, 0), (4, 8))], [_meta("w", (4, 0), (4, 8))]]
        )
    with pytest.raises(ShardError, match="tensor 'w': dtype is float32 on rank 0 but bfloat16 on rank 1"):
        assign_owners([[_meta("w", (0, 0), (4, 8))], [_meta("w", (4, 0), (4, 8), "bfloat16")]])


def test_shard_outside_the_global_tensor_is_refused():
    with pytest.raises(ShardError, match=r"tensor 'w': shard \[6:10\] on dim 0 lies outside global size 8"):
        ShardedTensor("w", torch.zeros(4, 8), (8, 8), (6, 0))


def test_fused_tensor_is_described_as_two_logical_tensors(tmp_path):
    # megatron linear_fc1 on TP rank r holds [gate_r; up_r]: two hyperslabs of two logical tensors
    gate, up, t = torch.randn(8, 4), torch.randn(8, 4), 2
    shards_per_rank = []
    for r in range(t):
        fused_r = torch.cat([gate[4 * r : 4 * r + 4], up[4 * r : 4 * r + 4]])
        shards_per_rank += [
            ShardedTensor("fc1.gate", fused_r[:4], (8, 4), (4 * r, 0)),
            ShardedTensor("fc1.up", fused_r[4:], (8, 4), (4 * r, 0)),
        ]
    ck = Checkpointer(tmp_path, async_save=False)
    with pytest.raises(ShardError, match="cover 16 of 32"):
        ck.save(1, shards_per_rank[:2], RunState(step=1))
    whole = [ShardedTensor("fc1.gate", gate, (8, 4), (0, 0)), ShardedTensor("fc1.up", up, (8, 4), (0, 0))]
    ck.save(1, whole, RunState(step=1))
    loaded = load_checkpoint(tmp_path, [ShardSpec("fc1.up", (8, 4), (4, 0), (4, 4), "float32")])
    assert torch.equal(loaded.tensors["fc1.up"], shards_per_rank[3].data)
    assert read_manifest(tmp_path / "step_00000001").tensors["fc1.gate"].global_shape == (8, 4)


def test_sharded_save_of_one_process_round_trips(tmp_path):
    tensors = global_tensors(4)
    Checkpointer(tmp_path, async_save=False).save(1, rank_shards(tensors, 0, 1, 1), RunState(step=1))
    loaded = load_checkpoint(tmp_path, rank_specs(tensors, 0, 1, 1))
    assert all(torch.equal(loaded.tensors[n], t) for n, t in tensors.items())


def test_seed_rngs_makes_every_saved_rng_a_function_of_the_seed():
    """Issue 14: python's and numpy's RNGs were checkpointed but never seeded (different on every run)."""
    from hpcrl.ckpt.state import capture_rng, seed_rngs

    def draws():
        return random.random(), float(np.random.rand()), float(torch.rand(()))

    seed_rngs(7)
    first, state = draws(), capture_rng()
    seed_rngs(7)
    assert draws() == first and capture_rng() == state
    seed_rngs(8)
    assert all(a != b for a, b in zip(draws(), first, strict=True))
    seed_rngs(10**30)  # any int seed


@pytest.mark.parametrize("publish", ["write_last", "write_durable"])
def test_a_rank_record_is_the_ranks_last_act_in_the_save_dir(tmp_path, monkeypatch, publish):
    """Rank 0 commits a save (renames its tmp dir) the moment every rank's record is there, so publishing
    a record must touch the directory no more. A loaded run: rank 1's fsync of the directory after its
    record's rename (`write_durable`, used for records until then) found the directory gone, and the run
    died of a save that rank 0 had committed. Here the rename itself lets 'rank 0' commit at once."""
    from hpcrl.ckpt import integrity

    save_dir = tmp_path / "step_00000004.tmp-token"
    save_dir.mkdir()
    real_replace = os.replace

    def replace_then_commit(src, dst):
        real_replace(src, dst)
        real_replace(save_dir, tmp_path / "step_00000004")  # rank 0 saw the record and committed

    monkeypatch.setattr(integrity.os, "replace", replace_then_commit)
    write = getattr(integrity, publish)
    if publish == "write_durable":  # the old way: the fsync after the rename finds the directory gone
        with pytest.raises(FileNotFoundError):
            write(save_dir / "rank_00001.json", b"{}")
        return
    write(save_dir / "rank_00001.json", b"{}")
    assert (tmp_path / "step_00000004" / "rank_00001.json").read_bytes() == b"{}"
