"""Damaged checkpoints are detected before any tensor is used; errors name the file and the tensor;
fallback to the previous good checkpoint on request; a failed load modifies nothing."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.load import CheckpointMismatch, ForeignCheckpoint, load_checkpoint
from hpcrl.ckpt.manifest import CorruptCheckpoint, read_manifest
from hpcrl.ckpt.shards import ShardSpec
from hpcrl.ckpt.state import RunState
from hpcrl.ckpt.verify import dataset_ranges, verify_directory
from tests.ckpt import _tamper
from tests.ckpt._model import global_tensors, rank_shards, rank_specs


def _tree_digest(root) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def two_steps(tmp_path):
    """Steps 1 and 2 saved by one process as its 2 'TP ranks'' worth of shards (t=1)."""
    ck = Checkpointer(tmp_path, keep_last=3, async_save=False)
    for step in (1, 2):
        ck.save(step, rank_shards(global_tensors(step), 0, 1, 1), RunState(step=step, run_id="run-a"))
    return tmp_path


def _specs():
    return rank_specs(global_tensors(0), 0, 1, 1)


def _flip_byte_in(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def _corrupt_flip(root):
    step = root / "step_00000002"
    manifest = read_manifest(step)
    start, stop, label = dataset_ranges(manifest, "rank_00000.h5")[manifest.tensors["proj"].shards[0].dataset]
    _flip_byte_in(step / "rank_00000.h5", (start + stop) // 2)
    return r"rank_00000\.h5: checksum mismatch in bytes \[\d+, \d+\): tensor proj\[0:4,0:16,0:16\]"


def _corrupt_truncate(root):
    path = root / "step_00000002" / "rank_00000.h5"
    path.write_bytes(path.read_bytes()[:-100])
    return r"rank_00000\.h5: size \d+ bytes, manifest says \d+ \(truncated or replaced\); it holds tensors .*qkv\[0:4,0:48,0:16\]"


def _corrupt_missing(root):
    (root / "step_00000002" / "rank_00000.h5").unlink()
    return r"rank_00000\.h5: shard file missing; it holds tensors .*embedding\[0:32,0:16\]"


def _corrupt_foreign_manifest(root):
    other = root.parent / (root.name + "-other")
    ck = Checkpointer(other, async_save=False)
    ck.save(2, rank_shards(global_tensors(99), 0, 1, 1), RunState(step=2, run_id="run-b"))
    shutil.copy(other / "step_00000002" / "manifest.json", root / "step_00000002" / "manifest.json")
    # the other run's files differ in structure (attributes) and data: the first segment checked names
    # the file and every tensor it holds
    return r"rank_00000\.h5: checksum mismatch in bytes \[0, \d+\): HDF5 structure of a file holding .*proj\["


def _corrupt_manifest_bytes(root):
    path = root / "step_00000002" / "manifest.json"
    path.write_text(path.read_text()[:-40])
    return r"manifest\.json: manifest does not parse"


def _corrupt_manifest_value(root):
    """A bit flip that leaves the manifest valid JSON, in a value no file checksum covers (an RNG
    state): before the manifest's own digest, it loaded."""
    path = root / "step_00000002" / "manifest.json"
    data = json.loads(path.read_bytes())
    data["rng"]["0"]["python"]["state"][7] ^= 0x40
    path.write_text(json.dumps(data))
    return r"manifest\.json: invalid manifest: manifest_digest does not match its content"


CORRUPTIONS = {
    "manifest_value": _corrupt_manifest_value,
    "flipped_byte": _corrupt_flip,
    "truncated": _corrupt_truncate,
    "missing_shard": _corrupt_missing,
    "foreign_manifest": _corrupt_foreign_manifest,
    "torn_manifest": _corrupt_manifest_bytes,
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corruption_is_detected_named_and_falls_back_without_modifying_anything(two_steps, kind):
    pattern = CORRUPTIONS[kind](two_steps)
    before = _tree_digest(two_steps)
    with pytest.raises(CorruptCheckpoint, match=pattern):
        load_checkpoint(two_steps, _specs())
    with pytest.raises(CorruptCheckpoint, match=pattern):
        verify_directory(two_steps / "step_00000002")
    loaded = load_checkpoint(two_steps, rank_specs(global_tensors(1), 0, 1, 1), fallback=True)
    assert loaded.state.step == 1 and loaded.path.name == "step_00000001"
    assert all(torch.equal(t, global_tensors(1)[n]) for n, t in loaded.tensors.items())
    assert len(loaded.skipped) == 1
    assert _tree_digest(two_steps) == before


def test_a_flip_in_a_tensor_this_rank_does_not_read_does_not_block_its_load(two_steps):
    _corrupt_flip(two_steps)
    loaded = load_checkpoint(two_steps, [ShardSpec("norm", (4, 16), (0, 0), (4, 16), "bfloat16")])
    assert loaded.state.step == 2 and torch.equal(loaded.tensors["norm"], global_tensors(2)["norm"])


def test_a_manifest_of_another_run_is_refused_when_the_run_id_is_expected(two_steps):
    """Not a damaged checkpoint: no fallback to an older one, nothing set aside (they are another run's)."""
    before = _tree_digest(two_steps)
    with pytest.raises(ForeignCheckpoint, match="written by run 'run-a', expected 'run-z'") as err:
        load_checkpoint(two_steps, _specs(), expect_run_id="run-z", fallback=True, set_aside_rejected=True)
    assert err.value.run_id == "run-a" and err.value.directory.name == "step_00000002"
    assert _tree_digest(two_steps) == before


def test_a_checkpoint_without_a_run_id_predates_run_ids_and_is_accepted(tmp_path):
    ck = Checkpointer(tmp_path, keep_last=2, async_save=False)
    ck.save(1, rank_shards(global_tensors(1), 0, 1, 1), RunState(step=1))
    assert load_checkpoint(tmp_path, _specs(), expect_run_id="run-z").state.step == 1


def test_failed_mismatched_load_modifies_nothing_and_does_not_fall_back(two_steps):
    before = _tree_digest(two_steps)
    with pytest.raises(CheckpointMismatch, match="tensor 'norm': global shape"):
        load_checkpoint(two_steps, [ShardSpec("norm", (8, 16), (0, 0), (8, 16), "bfloat16")], fallback=True)
    assert _tree_digest(two_steps) == before


def test_when_nothing_verifies_the_error_lists_every_candidate(two_steps):
    _corrupt_missing(two_steps)
    (two_steps / "step_00000001" / "manifest.json").unlink()
    with pytest.raises(
        CorruptCheckpoint, match=r"no checkpoint verifies: .*rank_00000.h5.* \| .*manifest missing"
    ):
        load_checkpoint(two_steps, _specs(), fallback=True)


def _rewrite_digests_as_sha256(step_dir) -> None:
    """What a checkpoint written before the XXH3 switch holds: bare SHA-256 hex segment digests (and
    no digest of the manifest itself, which came later)."""
    import json

    path = step_dir / "manifest.json"
    data = json.loads(path.read_bytes())
    del data["manifest_digest"]
    for file, entry in data["files"].items():
        raw = (step_dir / file).read_bytes()
        entry["segments"] = [
            [lo, hi, hashlib.sha256(raw[lo:hi]).hexdigest()] for lo, hi, _ in entry["segments"]
        ]
    path.write_text(json.dumps(data))


def test_new_checkpoints_use_xxh3_and_legacy_sha256_checkpoints_still_verify_and_catch_a_flip(two_steps):
    step = two_steps / "step_00000002"
    digests = [d for f in read_manifest(step).files.values() for _, _, d in f.segments]
    assert digests and all(d.startswith("xxh3_128:") and len(d) == len("xxh3_128:") + 32 for d in digests)
    _rewrite_digests_as_sha256(step)
    assert all(":" not in d for f in read_manifest(step).files.values() for _, _, d in f.segments)
    verify_directory(step)  # the legacy algorithm is taken from the digests themselves
    pattern = _corrupt_flip(two_steps)
    with pytest.raises(CorruptCheckpoint, match=pattern):
        verify_directory(step)


def test_a_digest_of_an_unknown_algorithm_is_a_corrupt_checkpoint_naming_the_file(two_steps):
    import json

    step = two_steps / "step_00000002"
    data = json.loads((step / "manifest.json").read_bytes())
    for entry in data["files"].values():
        entry["segments"] = [[lo, hi, "md4:00"] for lo, hi, _ in entry["segments"]]
    _tamper.write_json(step, data)
    with pytest.raises(CorruptCheckpoint, match=r"rank_00000\.h5: unknown checksum algorithm 'md4'"):
        verify_directory(step)


def test_a_manifest_over_its_size_cap_is_refused_before_it_is_parsed(two_steps, monkeypatch):
    from hpcrl.ckpt import manifest

    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(CorruptCheckpoint, match=r"manifest unreadable: is larger than 1,000 bytes"):
        read_manifest(two_steps / "step_00000002")
