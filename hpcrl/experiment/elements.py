"""Sweep elements: each made from the checked base config and its sweep values, and their lazy list.

Why not build every element from scratch: a sweep may have 100,000 elements (hpcrl.config.sweep_axes.
MAX_ELEMENTS); building, converting and hashing a whole ExperimentConfig per element cost ~1 ms, and
keeping them all ~1 GB. An element differs from the base only at its swept keys, so it is made by
copying the base along those keys' paths only (`dataclasses.replace` on the config, a path copy of the
plain data): every section the sweep leaves alone is the base's own object. The same sharing lets the
config id's JSON and the config.yaml text reuse each untouched section's text, made once (SectionTexts).
Elements share those objects: nothing may change a resolved config in place.

`Elements` is a sweep's element list without holding it: element i is made when asked for, from the
plan's i-th assignment and the config id recorded when the sweep was checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from hpcrl.config.schema import build, deep_merge, to_dict, with_values
from hpcrl.config.sweep_axes import SweepPlan
from hpcrl.config.yaml_io import canonical_json, canonical_json_joined, dump_yaml, dump_yaml_item
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.ids import UNSET, id_of_set_json, section_set
from hpcrl.experiment.stage_kinds import stage_data

TASKS_PER_NODE = "cluster.tasks_per_node"


@dataclass(frozen=True)
class ResolvedConfig:
    """One array element: its index in the sweep, its id and its config."""

    index: int
    config_id: str
    config: ExperimentConfig
    data: dict[str, Any]
    """The config as plain data (what is written to config.yaml)."""
    swept: dict[str, Any]
    """The swept keys' values of this element."""
    render: Callable[[dict[str, Any]], str] = field(default=dump_yaml, repr=False, compare=False)
    """Makes config.yaml's text from `data` (a sweep's reuses the text of shared sections)."""

    @property
    def run_dir(self) -> Path:
        return (Path(self.config.run_root) / self.config.name / self.config_id).absolute()

    def yaml_text(self) -> str:
        """The text of this element's config.yaml."""
        return self.render(self.data)


def _set_json(key: str, value: Any) -> str | None:
    """The canonical JSON of an item's user-set part (None when it is all default)."""
    differing = section_set(key, value)
    return None if differing is UNSET else canonical_json(differing)


class SectionTexts:
    """The canonical JSON of a config's top-level items' user-set parts (hpcrl.experiment.ids) and their
    YAML, made once for the base config and reused for every item of an element that is the base's own
    object (the identity test is exact: a shared object has the same value)."""

    def __init__(self, base: dict[str, Any]) -> None:
        self._base = base
        self._json = {key: _set_json(key, value) for key, value in base.items()}
        self._yaml = {key: dump_yaml_item(key, value) for key, value in base.items()}

    def _shared(self, key: str, value: Any) -> bool:
        return key in self._base and self._base[key] is value

    def config_id(self, data: dict[str, Any]) -> str:
        """= hpcrl.experiment.ids.config_id(data)."""
        items = {k: self._json[k] if self._shared(k, v) else _set_json(k, v) for k, v in data.items()}
        return id_of_set_json(
            canonical_json_joined({k: text for k, text in items.items() if text is not None})
        )

    def yaml(self, data: dict[str, Any]) -> str:
        """= dump_yaml(data)."""
        if not data:
            return dump_yaml(data)
        return "".join(self._yaml[k] if self._shared(k, v) else dump_yaml_item(k, v) for k, v in data.items())


class ElementMaker:
    """Makes the elements of one sweep from its checked base values (template chain, command line and
    profile merged, all normalised by check_tree) and the profile's own `cluster:` values."""

    def __init__(self, base: dict[str, Any], profile: dict[str, Any], plan: SweepPlan) -> None:
        cluster = base.get("cluster", {})
        config = build(ExperimentConfig, base)
        # Locally the world is this machine's processes: tasks_per_node follows the layout unless set.
        self._derive_tasks = (
            config.cluster.executor == "local"
            and "tasks_per_node" not in cluster
            and TASKS_PER_NODE not in plan.keys
        )
        self._profile_mappings = {
            f"cluster.{key}": value for key, value in profile.items() if isinstance(value, dict)
        }
        self.base_config, self.base_data = self._derived(config, stage_data(to_dict(config)))
        self.texts = SectionTexts(self.base_data)

    def make(self, index: int, assignment: dict[str, Any], known_id: str | None = None) -> ResolvedConfig:
        """Element `index` with its sweep values; its id is computed unless `known_id` is given."""
        values = {key: self._with_profile(key, value) for key, value in assignment.items()}
        config = replace_dotted(self.base_config, values)
        data = with_values(self.base_data, {key: to_dict(value) for key, value in values.items()})
        config, data = self._derived(config, data)
        element_id = known_id or self.texts.config_id(data)
        return ResolvedConfig(index, element_id, config, data, assignment, self.texts.yaml)

    def _with_profile(self, key: str, value: Any) -> Any:
        """A swept mapping under `cluster` merges over the profile's (as the template's own does)."""
        profile_value = self._profile_mappings.get(key)
        if profile_value is not None and isinstance(value, dict):
            return deep_merge(profile_value, value)
        return value

    def _derived(
        self, config: ExperimentConfig, data: dict[str, Any]
    ) -> tuple[ExperimentConfig, dict[str, Any]]:
        """cluster.tasks_per_node = ranks per element / nodes for the local executor when nobody set it.

        Why: locally `tasks_per_node` only says how many processes to start here, which the layout
        already says (parallel.tensor x pipeline x data); asking for it twice is one more way to be
        wrong (`hpcrl run T --parallel.tensor 2` would need `--cluster.tasks_per_node 2`). On Slurm it
        is a resource request the profile makes (one rank per GPU), so it stays explicit there."""
        if not self._derive_tasks:
            return config, data
        ranks, nodes = config.ranks_per_element, config.cluster.nodes
        if ranks < 1 or nodes < 1 or ranks % nodes or config.cluster.tasks_per_node == ranks // nodes:
            return config, data  # a wrong layout or node count is check_rules' to report
        config = replace_dotted(config, {TASKS_PER_NODE: ranks // nodes})
        return config, with_values(data, {TASKS_PER_NODE: ranks // nodes})


def replace_dotted(obj: Any, values: dict[str, Any]) -> Any:
    """A copy of config dataclass `obj` with dotted keys set; only the objects on their paths are new."""
    own: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for dotted, value in values.items():
        head, _, rest = dotted.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            own[head] = value
    for head, sub in nested.items():
        own[head] = replace_dotted(getattr(obj, head), sub)
    return dataclasses.replace(obj, **own) if own else obj


class Elements(Sequence[ResolvedConfig]):
    """The elements of a checked sweep, made one at a time (see the module docstring)."""

    def __init__(self, maker: ElementMaker, plan: SweepPlan, ids: list[str]) -> None:
        self._maker, self._plan, self._ids = maker, plan, ids

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, index: int) -> ResolvedConfig: ...

    @overload
    def __getitem__(self, index: slice) -> list[ResolvedConfig]: ...

    def __getitem__(self, index: int | slice) -> ResolvedConfig | list[ResolvedConfig]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"sweep element {index} is outside 0..{len(self) - 1}")
        return self._maker.make(index, self._plan.assignment(index), self._ids[index])

    def __iter__(self) -> Iterator[ResolvedConfig]:
        for index, assignment in enumerate(self._plan.assignments()):
            yield self._maker.make(index, assignment, self._ids[index])

    @property
    def ids(self) -> list[str]:
        """Every element's config id, in index order."""
        return self._ids
