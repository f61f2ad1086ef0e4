"""Sweep elements made from the base config (hpcrl.experiment.elements): the same configs, ids and files as
building each from scratch, random access into the sweep, bounded memory, the 100,000-element cap."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcrl.config.schema import leaf_types
from hpcrl.config.sweep_axes import MAX_ELEMENTS, SweepPlan, check_sweep
from hpcrl.config.yaml_io import canonical_json, canonical_json_joined, dump_yaml
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.resolve import resolve
from hpcrl.launcher import sweeps

REPO = Path(__file__).resolve().parents[2]
BASE = f"extends: {REPO / 'templates/grpo_tiny.yaml'}\ncluster: {{profile: local-dev, env: {{HPCRL_A: t}}}}\n"
LOCAL = f"extends: {REPO / 'templates/grpo_tiny.yaml'}\n"  # local executor: tasks_per_node follows the layout
AXES = {
    "optim.lr": st.floats(1e-6, 1e-2),
    "seed": st.integers(0, 10**6),
    "optim.betas": st.tuples(st.floats(0.5, 0.99), st.floats(0.9, 0.999)),
    "cluster.env": st.dictionaries(
        st.sampled_from(["HPCRL_A", "HPCRL_B", "OMP_NUM_THREADS"]), st.text("xy z", max_size=3)
    ),
    "algorithm.name": st.sampled_from(["grpo", "rloo"]),
    "cluster.cpus_per_task": st.integers(1, 4),
    "rollout.engine": st.sampled_from(["auto", "hf"]),
    "data.task": st.sampled_from(["copy_digits", "even_digits"]),
}


@st.composite
def sweeps_of(draw, axes: dict) -> dict:
    """A sweep section over 1-3 of `axes`: a grid axis, a zip pair or list points."""
    keys = draw(st.lists(st.sampled_from(sorted(axes)), min_size=1, max_size=3, unique=True))
    section = draw(st.sampled_from(["grid", "zip", "list"]))
    if section == "list":
        points = [{k: draw(axes[k]) for k in keys} for _ in range(draw(st.integers(1, 3)))]
        return {"list": points}
    length = draw(st.integers(1, 3))
    return {section: {k: [draw(axes[k]) for _ in range(length)] for k in keys}}


def plain(value):
    """YAML text of a sweep value (tuples as lists)."""
    return json.loads(json.dumps(value))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=st.one_of(
        st.tuples(st.just(BASE), sweeps_of(AXES)),
        st.tuples(st.just(LOCAL), sweeps_of({**AXES, "parallel.data": st.sampled_from([1, 2])})),
    )
)
def test_an_element_made_from_the_base_is_the_config_built_from_scratch(tmp_path, case):
    """Element i of a sweep = the same template without the sweep and element i's values on the command
    line (a config built whole, no sharing): equal config, plain data, id and config.yaml text."""
    base, sweep = case
    template = tmp_path / "t.yaml"
    template.write_text(base + dump_yaml({"sweep": plain(sweep)}))
    alone = tmp_path / "alone.yaml"
    alone.write_text(base)
    elements = resolve(template).elements
    for i, element in enumerate(elements):
        reference = resolve(alone, element.swept).elements[0]
        assert element.index == i and element.config == reference.config and element.data == reference.data
        assert element.config_id == reference.config_id
        assert element.yaml_text() == dump_yaml(reference.data)
    assert [e.config_id for e in elements] == elements.ids


@given(
    grid=st.lists(st.integers(1, 3), max_size=3),
    zip_length=st.integers(0, 3),
    points=st.integers(0, 3),
)
def test_the_ith_assignment_is_the_ith_of_the_expansion(grid, zip_length, points):
    plan = SweepPlan(
        grid={f"g{k}": list(range(n)) for k, n in enumerate(grid)},
        zip={"z0": list(range(zip_length)), "z1": list(range(10, 10 + zip_length))} if zip_length else {},
        points=[{"p": i} for i in range(points)],
    )
    expanded = list(plan.assignments())
    assert len(expanded) == len(plan)
    assert [plan.assignment(i) for i in range(len(plan))] == expanded


@given(st.dictionaries(st.text(max_size=6), st.dictionaries(st.text(max_size=4), st.integers()), max_size=5))
def test_joined_section_texts_are_the_canonical_json(data):
    assert canonical_json_joined({k: canonical_json(v) for k, v in data.items()}) == canonical_json(data)


def test_a_sweep_of_100000_elements_is_allowed_and_one_more_is_not():
    types = leaf_types(ExperimentConfig)
    at_cap = {"grid": {"seed": list(range(MAX_ELEMENTS // 4)), "parallel.data": [1, 2, 3, 4]}}
    plan, problems = check_sweep(at_cap, "t.yaml", types, lambda _k: None)
    assert len(plan) == MAX_ELEMENTS == 100_000 and not problems
    over = {"grid": {"seed": list(range(MAX_ELEMENTS // 4)), "parallel.data": [1, 2, 3, 4]}, "list": [{}, {}]}
    _, problems = check_sweep(over, "t.yaml", types, lambda _k: None)
    assert problems and "200,000 elements; a sweep has at most 100,000" in problems[0].message


def test_memory_per_element_is_its_manifest_entry_not_its_config(tmp_path):
    """Checking a sweep keeps each element's id; writing it keeps its manifest entry. Before, every
    element's config was kept twice (dataclasses and plain data), ~8 KB each."""

    def peak_bytes(n: int) -> int:
        template = tmp_path / f"t{n}.yaml"
        template.write_text(
            f"{BASE}run_root: {tmp_path / 'runs'}\nsweep: {{grid: {{seed: {list(range(n))}}}}}\n"
        )
        tracemalloc.start()
        try:
            sweep = resolve(template)
            sweeps.prepare(sweep, tmp_path / f"sweep{n}", dry_run=True)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak_bytes(200), peak_bytes(1000)
    assert (large - small) / 800 < 2000
