"""Property: any template with at least one mistake exits 2 and writes/submits nothing (>= 200 cases).

The templates use the dev-cluster profile (executor slurm), so a template that slipped through would
really be prepared and submitted: "nothing written under run_root" shows the submit path was never
reached (it writes the manifest before calling sbatch). tests/launcher/test_slurm_sweeps.py checks on
the real cluster that a bad template adds no job.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonargparse import ArgumentParser

from hpcrl import cli
from hpcrl.cli import submit
from hpcrl.config.schema import leaf_types, range_of
from hpcrl.config.yaml_io import dump_yaml
from hpcrl.errors import ConfigError
from hpcrl.experiment.config import ExperimentConfig

LEAVES = leaf_types(ExperimentConfig)
INT_KEYS = sorted(k for k, t in LEAVES.items() if t is int or (range_of(t) or (None,))[0] is int)
RANGED = {k: range_of(t) for k, t in LEAVES.items() if range_of(t) is not None}
STR_KEYS = sorted(k for k, t in LEAVES.items() if t is str and k != "run_root")  # the test overrides run_root
SECTIONS = [f.name for f in dataclasses.fields(ExperimentConfig)]
NAMES = st.from_regex(r"[a-z][a-z_]{2,10}", fullmatch=True)


def _set(tree: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


@st.composite
def mistake(draw, template: dict) -> str | None:
    """Apply one mistake to `template` (a dict); return raw text to append when it is a text-level one."""
    kind = draw(
        st.sampled_from(
            [
                "unknown_key",
                "wrong_int",
                "wrong_str",
                "bad_axis",
                "zip_lengths",
                "layout",
                "required",
                "axis_type",
                "duplicate_key",
                "bad_section",
                "out_of_range",
            ]
        )
    )
    if kind == "unknown_key":
        section = draw(st.sampled_from(["", "model.", "optim.", "algorithm.", "cluster.", "data."]))
        name = draw(NAMES.filter(lambda n: n not in SECTIONS and f"{section}{n}" not in LEAVES))
        _set(template, f"{section}{name}", 1)
    elif kind == "wrong_int":
        _set(
            template,
            draw(st.sampled_from(INT_KEYS)),
            draw(
                st.one_of(
                    st.text(min_size=1).filter(lambda s: not s.strip().lstrip("-").isdigit()),
                    st.lists(st.integers(), max_size=2),
                    st.booleans(),
                )
            ),
        )
    elif kind == "wrong_str":
        _set(
            template,
            draw(st.sampled_from(STR_KEYS)),
            draw(
                st.one_of(st.lists(st.text(), min_size=1), st.dictionaries(NAMES, st.integers(), min_size=1))
            ),
        )
    elif kind == "bad_axis":
        template.setdefault("sweep", {}).setdefault("grid", {})[
            f"algorithm.{draw(NAMES.filter(lambda n: f'algorithm.{n}' not in LEAVES))}"
        ] = [1, 2]
    elif kind == "zip_lengths":
        n = draw(st.integers(1, 4))
        template.setdefault("sweep", {})["zip"] = {
            "seed": list(range(n)),
            "algorithm.steps": list(range(n + 1)),
        }
    elif kind == "layout":
        data = draw(st.integers(1, 4))
        _set(template, "parallel.data", data)
        _set(template, "cluster.tasks_per_node", data + draw(st.integers(1, 3)))
    elif kind == "required":
        _set(template, "data.source", draw(st.sampled_from(["jsonl", "parquet", "hf_disk"])))
    elif kind == "axis_type":
        template.setdefault("sweep", {}).setdefault("grid", {})["algorithm.steps"] = [1, "two"]
    elif kind == "out_of_range":
        key = draw(st.sampled_from(sorted(RANGED)))
        number, bounds = RANGED[key]
        below = bounds.ge - 1 if bounds.ge is not None else bounds.gt
        above = bounds.le + 1 if bounds.le is not None else bounds.lt
        outside = [v for v in (below, above) if v is not None]
        outside += [10**30] if above is not None else []  # past every upper bound
        outside += [float("nan"), float("inf"), -float("inf")] if number is float else []
        _set(template, key, number(draw(st.sampled_from(outside))))
    elif kind == "bad_section":
        template.setdefault("sweep", {})[draw(NAMES.filter(lambda n: n not in ("grid", "zip", "list")))] = {}
    else:
        return "seed: 1\nseed: 2\n"
    return None


@st.composite
def bad_templates(draw) -> str:
    template: dict = {
        "name": "prop",
        "entrypoint": "hpcrl.launcher.probe:main",
        "cluster": {"profile": "local-dev"},
    }
    extra = ""
    for _ in range(draw(st.integers(1, 3))):
        extra += draw(mistake(template)) or ""
    text = dump_yaml(template)
    return text + extra


# Parsed once (jsonargparse takes ~40 ms per parse); each example swaps in its template and run_root.
_PARSER = ArgumentParser(exit_on_error=False)
submit.add_arguments(_PARSER)  # the `hpcrl submit` subcommand's own parser
ARGS = _PARSER.parse_args(["TEMPLATE", "--run_root", "RUNS"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_templates())
def test_bad_templates_exit_2_and_submit_nothing(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.yaml"
        path.write_text(text)
        runs = Path(tmp) / "runs"
        args = ARGS.clone()
        args["template"], args["run_root"] = str(path), str(runs)
        with pytest.raises(ConfigError) as err:
            submit.main(args)
        assert err.value.exit_code == 2, text
        assert err.value.problems and all(p.key or p.file for p in err.value.problems)
        assert not runs.exists(), text


def test_cli_maps_a_bad_template_to_exit_2(tmp_path):
    (tmp_path / "t.yaml").write_text("cluster: {profile: local-dev, nodes: two}\n")
    assert cli.main(["submit", str(tmp_path / "t.yaml"), "--run_root", str(tmp_path / "runs")]) == 2
    assert not (tmp_path / "runs").exists()
