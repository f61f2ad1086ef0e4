"""Property: whatever is done to a saved checkpoint's manifest, HDF5 file or directory entries, a load
returns exactly the saved tensors of the step it says, or raises a CorruptCheckpoint (or the loader's
CheckpointMismatch) naming a path in the checkpoint and the rule broken; never another exception, never
other bytes. With fallback and an older good checkpoint, it loads that one; the owner's fallback sets
the rejected one aside, and the same step then commits again (no crash loop).

Not in scope: a forger who rewrites a dataset's values with the same dtype and shape and then re-seals
the checksums (they guard against damage, not against an adversary: hpcrl.ckpt.integrity)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.load import CheckpointMismatch, load_checkpoint
from hpcrl.ckpt.manifest import CorruptCheckpoint
from hpcrl.ckpt.state import RunState
from tests.ckpt import _tamper
from tests.ckpt._model import expected_local, global_tensors, rank_shards, rank_specs

STEP2 = "step_00000002"
LAYOUTS = [(0, 1, 1), (0, 2, 1), (1, 2, 1), (1, 1, 2), (3, 4, 1)]  # (rank, t, p) of the load
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2**66),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.sampled_from(
        ["../rank_00000.h5", "/etc/passwd", "rank_00000.h5", "sub/x", "float64", "bfloat16", "s000000", ""]
    ),
    st.lists(st.integers(-1, 40), max_size=4),
    st.just({}),
)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    root = tmp_path_factory.mktemp("template") / "ckpt"
    ck = Checkpointer(root, keep_last=3, async_save=False)
    for step in (1, 2):
        ck.save(step, rank_shards(global_tensors(step), 0, 1, 1), RunState(step=step, run_id="r"))
    return root


# ---- mutations ----


def _walk(draw, node: Any) -> list[Any]:
    """A path of keys/indices from the manifest's root, each level chosen at random, stopping anywhere."""
    path: list[Any] = []
    while isinstance(node, (dict, list)) and node and (not path or draw(st.integers(0, 3))):
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        path.append(key)
        node = node[key]
    return path


def _tweak(draw, value: Any) -> Any:
    """A near miss of `value` (same type where it has one), or any JSON value."""
    if draw(st.booleans()):
        return draw(VALUES)
    if isinstance(value, bool) or value is None:
        return not value
    if isinstance(value, int):
        return value + draw(st.sampled_from([-1, 1, value, 4096]))
    if isinstance(value, str):
        i = draw(st.integers(0, max(len(value) - 1, 0)))
        return value[:i] + draw(st.sampled_from(["x", "0", "/", ".."])) + value[i + 1 :]
    if isinstance(value, list) and value:
        i = draw(st.integers(0, len(value) - 1))
        return draw(st.sampled_from([value[:i] + value[i + 1 :], [*value, value[i]], value[::-1]]))
    if isinstance(value, dict) and value:
        key = draw(st.sampled_from(sorted(value)))
        renamed = draw(st.sampled_from([None, f"../{key}", f"{key}x", "/etc/passwd"]))
        return {(renamed if k == key else k): v for k, v in value.items() if renamed or k != key}
    return draw(VALUES)


def mutate_manifest(draw, step: Path) -> str:
    data = _tamper.read_json(step)
    path = _walk(draw, data)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if path and draw(st.integers(0, 5)) == 0:
        del parent[path[-1]]
    elif path:
        parent[path[-1]] = _tweak(draw, parent[path[-1]])
    else:
        data = _tweak(draw, data)
    if draw(st.booleans()) and isinstance(data, dict):
        _tamper.reseal_fingerprints(data)  # only the schema and the trust rules can refuse it now
    _tamper.write_json(step, data)
    return f"manifest {path}"


def mutate_hdf5(draw, step: Path, outside: Path) -> str:
    data = _tamper.read_json(step)
    tensor = draw(st.sampled_from(sorted(data["tensors"])))
    _, dataset = _tamper.dataset_of(data, tensor)
    path = step / "rank_00000.h5"
    kind = draw(st.sampled_from(["flip", "attribute", *sorted(_tamper.forgeries(outside))]))
    if kind == "flip":  # damage, never re-sealed: re-sealed it would be a forgery of the values
        _tamper.flip_byte(path, draw(st.integers(0, path.stat().st_size - 1)))
        return "flip"
    if kind == "attribute":
        import h5py

        with h5py.File(path, "a") as fh:
            fh[dataset].attrs["hpcrl"] = draw(st.text(max_size=5))
    else:
        _tamper.replace_dataset(path, dataset, _tamper.forgeries(outside)[kind])
    if draw(st.booleans()):
        _tamper.reseal(step)
    return f"hdf5 {kind} {tensor}"


def mutate_entries(draw, root: Path, outside: Path) -> str:
    step = root / STEP2
    kind = draw(
        st.sampled_from(
            ["symlink_file", "symlink_manifest", "symlink_step", "fifo_file", "dir_as_file", "missing_file",
             "missing_manifest", "extra_file", "truncate", "rename_file", "latest"]
        )
    )  # fmt: skip
    rank = step / "rank_00000.h5"
    if kind.startswith("symlink_"):
        what = {"symlink_file": rank, "symlink_manifest": step / "manifest.json", "symlink_step": step}[kind]
        shutil.move(what, outside / what.name)
        os.symlink(outside / what.name, what)
    elif kind in ("fifo_file", "dir_as_file", "missing_file"):
        rank.unlink()
        {"fifo_file": os.mkfifo, "dir_as_file": os.mkdir, "missing_file": lambda _: None}[kind](rank)
    elif kind == "missing_manifest":
        (step / "manifest.json").unlink()
    elif kind == "extra_file":
        (step / draw(st.sampled_from(["junk.h5", "rank_00001.h5", "latest"]))).write_bytes(b"\0" * 8)
    elif kind == "truncate":
        os.truncate(rank, draw(st.integers(0, rank.stat().st_size - 1)))
    elif kind == "rename_file":
        rank.rename(step / "rank_00001.h5")
    else:
        text = draw(st.sampled_from(["", "step_00000001", "step_00000000", "step_00000003", "x\xff", None]))
        (root / "latest").unlink()
        if text is not None:
            (root / "latest").write_bytes(text.encode("latin-1"))
    return kind


# ---- the property ----


def _check_outcome(root: Path, specs, *, fallback: bool, what: str) -> int | None:
    """Load; returns the loaded step (its tensors checked bitwise) or None after an allowed refusal."""
    try:
        loaded = load_checkpoint(root, specs, fallback=fallback)
    except (CorruptCheckpoint, CheckpointMismatch) as err:
        message = str(err)
        event(f"refused: {type(err).__name__}")
        assert str(root) in message, f"{what}: the error names no path in the checkpoint: {message}"
        assert "unreadable:" not in message, f"{what}: no rule caught it: {message}"
        assert not (fallback and isinstance(err, CorruptCheckpoint)), f"{what}: no fallback: {message}"
        return None
    step = loaded.state.step
    event(f"loaded step {step}" + (" with fallback" if fallback else ""))
    assert loaded.path.name == f"step_{step:08d}", what
    saved = global_tensors(step)
    for spec in specs:
        assert torch.equal(loaded.tensors[spec.name], expected_local(saved, spec)), f"{what}: {spec.name}"
    return step


@pytest.mark.heavy
@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,  # the same examples in CI and here; a new rule must still pass all of them
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.data())
def test_a_mutated_checkpoint_loads_exactly_or_is_refused_naming_the_file_and_falls_back(template, data):
    rank, t, p = data.draw(st.sampled_from(LAYOUTS))
    specs = rank_specs(global_tensors(0), rank, t, p)
    with tempfile.TemporaryDirectory(dir=template.parent) as tmp:
        root, outside = Path(tmp) / "ckpt", Path(tmp) / "outside"
        shutil.copytree(template, root)
        outside.mkdir()
        kind = data.draw(st.sampled_from(["manifest", "hdf5", "entries"]))
        if kind == "manifest":
            what = mutate_manifest(data.draw, root / STEP2)
        elif kind == "hdf5":
            what = mutate_hdf5(data.draw, root / STEP2, outside)
        else:
            what = mutate_entries(data.draw, root, outside)
        _check_outcome(root, specs, fallback=False, what=what)
        step = _check_outcome(root, specs, fallback=True, what=what)
        if step == 1:  # the owner's fallback sets step 2 aside; saving step 2 again then commits
            ck = Checkpointer(root, keep_last=3, async_save=False)
            assert ck.load(specs, fallback=True).state.step == 1
            ck.save(2, rank_shards(global_tensors(2), 0, 1, 1), RunState(step=2, run_id="r"))
            assert _check_outcome(root, specs, fallback=False, what=what) == 2
