"""The checkpoint directory is a trust boundary (hpcrl.ckpt.trust): a manifest cannot make the loader
read outside its step directory, an HDF5 file cannot redirect a dataset elsewhere or to fill values, and
a dataset whose dtype or shape differs from a consistent manifest is refused before any byte is copied.
Every refusal is a CorruptCheckpoint naming the file (and dataset) and the rule, and falls back."""

from __future__ import annotations

import os
import shutil

import h5py
import numpy as np
import pytest
import torch

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.commit import REJECTED, candidates, committed
from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import CorruptCheckpoint
from hpcrl.ckpt.state import RunState
from hpcrl.ckpt.verify import verify_directory
from hpcrl.cli import main
from tests.ckpt import _tamper
from tests.ckpt._model import global_tensors, rank_shards, rank_specs

STEP2 = "step_00000002"


@pytest.fixture
def two_steps(tmp_path):
    """Steps 1 and 2 of the synthetic model saved by one process (t=1: one file holds every tensor)."""
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, keep_last=3, async_save=False)
    for step in (1, 2):
        ck.save(step, rank_shards(global_tensors(step), 0, 1, 1), RunState(step=step))
    return root


def _specs():
    return rank_specs(global_tensors(0), 0, 1, 1)


def _assert_refused_and_falls_back(root, pattern: str) -> None:
    """Refused by the loader and by `hpcrl ckpt check` with `pattern`; fallback loads step 1 exactly."""
    with pytest.raises(CorruptCheckpoint, match=pattern):
        load_checkpoint(root, _specs())
    with pytest.raises(CorruptCheckpoint, match=pattern):
        verify_directory(root / STEP2, root)
    assert main(["ckpt", "check", str(root)]) == 1
    loaded = load_checkpoint(root, _specs(), fallback=True)
    assert loaded.path.name == "step_00000001" and len(loaded.skipped) == 1
    assert all(torch.equal(t, global_tensors(1)[n]) for n, t in loaded.tensors.items())


# ---- paths: nothing outside the step directory ----


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "nested"])
def test_a_manifest_naming_a_file_outside_the_step_dir_is_refused(two_steps, tmp_path, kind):
    step = two_steps / STEP2
    real = step / "rank_00000.h5"
    target = {
        "dotdot": step.parent.parent / "outside.h5",
        "absolute": tmp_path / "elsewhere" / "outside.h5",
        "nested": step / "sub" / "rank_00000.h5",
    }[kind]
    target.parent.mkdir(exist_ok=True)
    shutil.copy(real, target)  # the very same bytes: only the rule can refuse it
    name = {"dotdot": "../../outside.h5", "absolute": str(target), "nested": "sub/rank_00000.h5"}[kind]
    data = _tamper.read_json(step)
    data["files"][name] = data["files"].pop("rank_00000.h5")
    for tensor in data["tensors"].values():
        for shard in tensor["shards"]:
            shard["file"] = name
    _tamper.reseal_fingerprints(data)
    _tamper.write_json(step, data)
    _assert_refused_and_falls_back(two_steps, rf"manifest\.json: file name '{name}' is not a plain name")


@pytest.mark.parametrize("link", ["rank_00000.h5", "manifest.json"])
def test_a_file_that_is_a_symlink_out_of_the_step_dir_is_refused(two_steps, tmp_path, link):
    path = two_steps / STEP2 / link
    outside = tmp_path / f"outside-{link}"
    shutil.move(path, outside)
    os.symlink(outside, path)  # same bytes, elsewhere
    _assert_refused_and_falls_back(
        two_steps, rf"{link}: a symbolic link \(to .*outside-{link}\); checkpoint files must be regular files"
    )


def test_a_step_dir_that_is_a_symlink_is_refused_and_a_falling_back_owner_sets_it_aside(two_steps, tmp_path):
    outside = tmp_path / "outside-step"
    shutil.move(two_steps / STEP2, outside)
    os.symlink(outside, two_steps / STEP2)
    _assert_refused_and_falls_back(
        two_steps, rf"{STEP2}: a symbolic link \(to .*outside-step\); a step directory"
    )
    loaded = Checkpointer(two_steps, async_save=False).load(_specs(), fallback=True)
    assert loaded.path.name == "step_00000001"
    [aside] = [p for p in two_steps.iterdir() if REJECTED in p.name]
    assert aside.is_symlink() and (outside / "manifest.json").exists()  # the link moved, not its target
    assert (two_steps / "latest").read_text().strip() == "step_00000001"


# ---- HDF5: datasets stored plainly in the file itself, as the manifest says ----


def _h5(root):
    return root / STEP2 / "rank_00000.h5"


HDF5_CASES = {
    # forgery (tests/ckpt/_tamper.py): (tensor, the rule's words)
    "external_link": ("proj", r"is a ExternalLink; datasets must be stored in the file itself"),
    "external_storage": ("proj", r"external raw storage in '.*passwd'"),
    "virtual": ("proj", r"a virtual dataset \(VDS\)"),
    "compact": ("proj", r"compact layout; datasets must be contiguous or chunked"),
    "gzip": ("proj", r"stored through 1 filter\(s\); the format has none"),
    "group": ("proj", r"is a Group, not a dataset"),
    "float64": ("opt.exp_avg.proj", r"dtype <f8 in the file, the manifest says float32 \(stored as <f4\)"),
    "big_endian": ("opt.exp_avg.proj", r"dtype >f4 in the file, the manifest says float32"),
    "one_row_more": ("proj", r"shape \(5, 16, 16\) in the file, the manifest says \(4, 16, 16\)"),
    "one_row_less": ("proj", r"shape \(3, 16, 16\) in the file"),
    "transposed": ("fc1.gate", r"shape \(16, 24, 4\) in the file, the manifest says \(4, 24, 16\)"),
    "missing": ("proj", r"missing$"),
}


@pytest.mark.parametrize("kind", sorted(HDF5_CASES))
def test_an_hdf5_dataset_that_is_not_what_a_consistent_manifest_says_is_refused(two_steps, tmp_path, kind):
    tensor, rule = HDF5_CASES[kind]
    _, dataset = _tamper.dataset_of(_tamper.read_json(two_steps / STEP2), tensor)
    _tamper.replace_dataset(_h5(two_steps), dataset, _tamper.forgeries(tmp_path)[kind])
    _tamper.reseal(two_steps / STEP2)  # sizes, offsets and checksums agree with the forged file
    pattern = rf"rank_00000\.h5: dataset '{dataset}' \(tensor {tensor}\[[0-9:,]+\]\): .*{rule}"
    _assert_refused_and_falls_back(two_steps, pattern)


def test_a_soft_link_to_another_dataset_of_the_same_shape_is_refused(two_steps):
    data = _tamper.read_json(two_steps / STEP2)
    _, gate = _tamper.dataset_of(data, "fc1.gate")
    _, up = _tamper.dataset_of(data, "fc1.up")
    _tamper.replace_dataset(_h5(two_steps), up, lambda fh, n, d: fh.__setitem__(n, h5py.SoftLink(f"/{gate}")))
    _tamper.reseal(two_steps / STEP2)
    _assert_refused_and_falls_back(two_steps, rf"dataset '{up}' \(tensor fc1\.up\[.*is a SoftLink")


def test_a_shard_file_that_is_not_hdf5_is_refused_naming_it(two_steps):
    path = _h5(two_steps)
    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))
    _tamper.reseal(two_steps / STEP2)
    _assert_refused_and_falls_back(two_steps, r"rank_00000\.h5: not a readable HDF5 file")


def test_a_chunked_dataset_without_a_recorded_offset_loads_and_its_file_is_verified_whole(two_steps):
    """Chunked storage is allowed; no checksum segment is tied to its chunks, so its file is hashed whole."""
    _, dataset = _tamper.dataset_of(_tamper.read_json(two_steps / STEP2), "proj")
    _tamper.replace_dataset(_h5(two_steps), dataset, _tamper.forgeries(two_steps)["chunked"])
    _tamper.reseal(two_steps / STEP2)
    assert dataset not in _tamper.read_json(two_steps / STEP2)["files"]["rank_00000.h5"]["byte_offsets"]
    spec = [s for s in _specs() if s.name == "proj"]
    loaded = load_checkpoint(two_steps, spec)
    assert torch.equal(loaded.tensors["proj"], global_tensors(2)["proj"])
    assert loaded.bytes_verified >= _h5(two_steps).stat().st_size
    with h5py.File(_h5(two_steps), "r") as fh:
        offset = fh[dataset].id.get_chunk_info(1).byte_offset
    _tamper.flip_byte(_h5(two_steps), offset + 3)
    with pytest.raises(CorruptCheckpoint, match=r"rank_00000\.h5: checksum mismatch"):
        load_checkpoint(two_steps, spec)


# ---- the manifest itself ----


def test_a_damaged_rng_state_is_refused_at_load_not_when_the_resume_restores_it(two_steps):
    data = _tamper.read_json(two_steps / STEP2)
    data["rng"]["0"]["torch"] = data["rng"]["0"]["torch"][:-8]  # still base64, a few bytes short
    _tamper.write_json(two_steps / STEP2, data)
    _assert_refused_and_falls_back(two_steps, r"manifest\.json: rank 0: RNG state does not restore")


def test_a_manifest_of_another_step_is_refused(two_steps):
    shutil.copy(two_steps / "step_00000001" / "manifest.json", two_steps / STEP2 / "manifest.json")
    _assert_refused_and_falls_back(two_steps, rf"manifest\.json: says step 1, but its directory is {STEP2}")


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("global_shape", "4", r"expected a list of integers"),
        ("dtype", "float31", r"unknown dtype 'float31'"),
        ("offset", [0, -1, 0], r"expected an integer >= 0"),
        ("shape", [4, 16, 15], r"shards cover 960 of 1024 elements"),
    ],
)
def test_a_manifest_breaking_its_own_schema_is_refused_naming_the_field(two_steps, field, value, rule):
    data = _tamper.read_json(two_steps / STEP2)
    entry = data["tensors"]["proj"]
    (entry if field in entry else entry["shards"][0])[field] = value
    _tamper.reseal_fingerprints(data)  # consistent fingerprints: only the schema can refuse it
    _tamper.write_json(two_steps / STEP2, data)
    _assert_refused_and_falls_back(two_steps, rf"manifest\.json: invalid manifest: .*{rule}")


# ---- which directories are candidates ----


@pytest.mark.parametrize("latest", [None, "", "step_x\n", "\xff garbage", "step_00000009"])
def test_without_a_usable_latest_every_committed_dir_is_a_candidate_newest_first(two_steps, latest):
    (two_steps / "latest").unlink()
    if latest is not None:
        (two_steps / "latest").write_bytes(latest.encode("latin-1"))
    (two_steps / f"step_00000003{REJECTED}20261201T000000.000000Z").mkdir()
    assert [p.name for p in candidates(two_steps)] == [STEP2, "step_00000001"]
    assert [s for s, _ in committed(two_steps)] == [2, 1]
    assert load_checkpoint(two_steps, _specs()).path.name == STEP2


def test_latest_bounds_the_candidates_unless_it_names_no_directory(two_steps):
    (two_steps / "latest").write_text("step_00000001\n")
    assert [p.name for p in candidates(two_steps)] == ["step_00000001"]  # step 2: an abandoned future
    (two_steps / "latest").write_text("step_00000000\n")  # garbled: it would hide every checkpoint
    assert [p.name for p in candidates(two_steps)] == [STEP2, "step_00000001"]
