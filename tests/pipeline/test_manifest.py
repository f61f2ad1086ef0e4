"""The pipeline record (`pipeline.json`) read back as untrusted data, the dependency parameters each stage
is submitted with, and a stage's state from its elements' Slurm states (hpcrl.pipeline.status)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcrl.errors import ConfigError
from hpcrl.launcher.sbatch import render_sbatch
from hpcrl.launcher.sweep_manifest import Entry, Manifest
from hpcrl.pipeline.manifest import PipelineManifest, StageRecord, load_pipeline_manifest
from hpcrl.pipeline.status import StageStatus, _stage_state
from hpcrl.pipeline.submit import with_dependency


def _record(tmp_path: Path) -> PipelineManifest:
    stages = [StageRecord("sft", []), StageRecord("rm", ["sft"]), StageRecord("rl", ["sft", "rm"])]
    return PipelineManifest(str(tmp_path), "tiny", "/p.yaml", "2026-12-07T00:00:00Z", stages)


def test_the_record_round_trips_and_names_each_stages_dependents(tmp_path):
    record = _record(tmp_path)
    record.stages[0].job_ids = ["12"]
    record.save()
    back = load_pipeline_manifest(tmp_path)
    assert back == record
    assert back.downstream("sft") == ["sft", "rm", "rl"] and back.downstream("rm") == ["rm", "rl"]


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"version": 2}, "version"),
        ({"stages": []}, "stages"),
        ({"stages": [{"name": "../etc"}]}, "stages[0].name"),
        ({"stages": [{"name": "a"}, {"name": "a"}]}, "stages[1].name"),
        ({"stages": [{"name": "a", "after": ["b"]}, {"name": "b"}]}, "stages[0].after"),
        ({"stages": [{"name": "a", "job_ids": ["1; rm -rf /"]}]}, "stages[0].job_ids"),
        ({"stages": [{"name": "a", "state": "RUNNING\x1b"}]}, "stages[0].state"),
        ({"stages": [{"name": "a", "sweep_dir": "/etc"}]}, "stages[0].name"),
        ({"name": 3}, "name"),
    ],
)
def test_a_hand_edited_record_is_refused_naming_its_key(tmp_path, patch, key):
    record = _record(tmp_path)
    record.save()
    data = json.loads(record.path.read_text()) | patch
    record.path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        load_pipeline_manifest(tmp_path)
    assert err.value.problems[0].key == key and err.value.problems[0].file == str(record.path)


STAGE_RECORDS = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["a", "b", "c", "../x", "A", "", "a/b"])},
        optional={
            "after": st.lists(st.sampled_from(["a", "b", "c", "z"]), max_size=2),
            "state": st.sampled_from(["NEW", "QUEUED", "DRY_RUN", "DONE", ""]),
            "job_ids": st.lists(st.sampled_from(["12", "12_3", "-1", "1" * 11, "x"]), max_size=2),
            "reason": st.none() | st.text(max_size=5) | st.integers(),
            "extra": st.just(1),
        },
    ),
    max_size=4,
)
JSON_TREES = st.recursive(
    st.none() | st.text(max_size=5) | st.integers(),
    lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c),
    max_leaves=20,
)


def _as_record(stages) -> bytes:
    return json.dumps({"version": 1, "name": "x", "file": "f", "created": "c", "stages": stages}).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=300) | (STAGE_RECORDS | JSON_TREES).map(_as_record))
def test_any_bytes_as_a_record_load_or_are_refused_naming_the_file(tmp_path, raw):
    (tmp_path / "pipeline.json").write_bytes(raw)
    try:
        record = load_pipeline_manifest(tmp_path)
    except ConfigError as err:
        assert all(p.file.endswith("pipeline.json") for p in err.problems)
    else:
        assert all(Path(record.stage_dir(s.name)).parent == tmp_path.absolute() for s in record.stages)


def test_a_stage_waits_for_every_array_of_its_upstreams_and_dies_with_them():
    params = {"job_name": "hpcrl-x", "nodes": 1, "stderr_to_stdout": False, "signal_delay_s": 30, "time": 5}
    assert with_dependency(params, []) is params
    script = render_sbatch(with_dependency(params, ["12", "13"]), "/tmp/f", 4, "python")
    assert (
        "#SBATCH --dependency=afterok:12:13\n" in script and "#SBATCH --kill-on-invalid-dep=yes\n" in script
    )


def _manifest(*states_and_reasons: tuple[str, str | None]) -> Manifest:
    entries = [
        Entry(i, "id", f"/r/{i}/config.yaml", f"/r/{i}", {}, f"5_{i}", state, [], reason)
        for i, (state, reason) in enumerate(states_and_reasons)
    ]
    return Manifest("/s", "t", "n", "slurm", "c", [], entries)


def test_an_element_cancelled_by_hand_while_its_upstream_runs_is_not_blamed_on_it():
    upstream = [StageStatus("sft", [], "RUNNING", None, {}, None)]
    state, reason = _stage_state(_manifest(("CANCELLED", "Dependency")), upstream, ["sft"])
    assert state == "FAILED" and "upstream" not in reason


@pytest.mark.parametrize(
    ("elements", "state", "reason"),
    [
        ([("COMPLETED", None), ("COMPLETED", None)], "COMPLETED", None),
        ([("PENDING", "Dependency"), ("PENDING", "Dependency")], "WAITING", "on sft"),
        (
            [("CANCELLED", "DependencyNeverSatisfied")],
            "CANCELLED_BY_UPSTREAM",
            "upstream stage sft did not complete",
        ),
        ([("CANCELLED", "Dependency")], "CANCELLED_BY_UPSTREAM", "sft did not complete"),  # sacct's words
        (
            [("COMPLETED", None), ("FAILED", "ValueError: boom")],
            "FAILED",
            "element 1 FAILED: ValueError: boom",
        ),
        ([("RUNNING", None), ("PENDING", "Resources")], "RUNNING", None),
        ([("PENDING", "Priority")], "PENDING", None),
    ],
)
def test_a_stage_state_says_what_its_elements_and_slurm_say(elements, state, reason):
    upstream = [StageStatus("sft", [], "FAILED", None, {}, None)]
    got = _stage_state(_manifest(*elements), upstream, ["sft"])
    assert got[0] == state and (reason is None and got[1] is None or reason in got[1]), got
