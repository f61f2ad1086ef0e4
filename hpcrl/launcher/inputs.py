"""An element's inputs from other elements: bound when it starts, verified before it loads them.

A pipeline (hpcrl.pipeline) writes `<run_dir>/inputs.json` into each consumer's run directory at
submit: for each config key that takes an upstream stage's output, the stage, the output, the candidate
run directories (one, or a sweep's elements for a selection rule) and the rule. When the element starts,
its rank 0 (`bind_inputs`):

- picks the element a rule names — `best`/`max`: the highest last logged value of the metric in the
  candidates' metrics.jsonl, `min`: the lowest — and records the choice in `<run_dir>/inputs.selected.json`
  (a restarted attempt reads it back: the same element, whatever was logged since);
- verifies every HF export it will load (hpcrl.ckpt.export_manifest: every file listed, sizes and
  sha256, nothing added): a missing, partial or altered export is a ConfigError naming the stage and
  the key, before anything is loaded; the stamps of what passed go to `<run_dir>/inputs.verified.json`,
  and a restarted attempt re-hashes only files whose size, mtime or inode changed since;
- returns the config values to use: the reference text in the config replaced by the chosen path.

Every rank then runs with the same values (hpcrl.launcher.element broadcasts rank 0's). The file is read
as untrusted data: every field of its type, every path absolute and without `..`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrl.ckpt.export_manifest import check_export
from hpcrl.config.safe_read import read_capped
from hpcrl.config.yaml_io import atomic_write
from hpcrl.errors import ConfigError, Problem
from hpcrl.metrics.sinks import step_records

INPUTS = "inputs.json"
SELECTED = "inputs.selected.json"
VERIFIED = "inputs.verified.json"
"""Per export this element verified: its files' stamps (hpcrl.ckpt.export_manifest.check_export), so a
restarted attempt hashes only what changed since."""
MAX_BYTES = 4 << 20
MAX_METRICS_BYTES = 1 << 30
"""A candidate's metrics.jsonl read to pick by a rule: a million steps of a hundred metrics fit."""
RULES = {"best": max, "max": max, "min": min}
OUTPUTS = ("run_dir", "checkpoint", "hf")
REQUIRED = {"key", "reference", "stage", "output", "candidates", "outputs"}


@dataclass(frozen=True)
class Input:
    key: str
    """The dotted config key that takes the output."""
    reference: str
    """The reference text in the key's config value, replaced by the chosen path."""
    stage: str
    output: str
    candidates: list[str]
    """Run directories of the upstream stage's elements the value may come from (one without a rule)."""
    outputs: list[str]
    """The output path of each candidate (its run dir, checkpoint root or HF export)."""
    rule: str | None = None
    metric: str | None = None


def write_inputs(run_dir: Path, inputs: list[Input]) -> None:
    atomic_write(run_dir / INPUTS, json.dumps([vars(i) for i in inputs], indent=1))


def read_inputs(run_dir: Path) -> list[Input]:
    """The element's inputs ([] without inputs.json); ConfigError naming the file for a malformed one."""
    path = run_dir / INPUTS
    try:
        raw = json.loads(read_capped(path, MAX_BYTES, follow_symlinks=False).decode("utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError, RecursionError) as err:
        raise ConfigError(
            Problem(f"unreadable inputs record ({type(err).__name__})", file=str(path))
        ) from None
    if not isinstance(raw, list):
        raise ConfigError(Problem("must be a list of inputs", file=str(path)))
    return [_input(item, str(path), f"[{n}]") for n, item in enumerate(raw)]


def _input(item: Any, file: str, where: str) -> Input:
    fields = set(Input.__dataclass_fields__)
    if not isinstance(item, dict) or set(item) - fields or not set(item) >= REQUIRED:
        raise ConfigError(Problem(f"an input has {', '.join(sorted(fields))}", file=file, key=where))
    found = Input(**item)
    lists = isinstance(found.candidates, list) and isinstance(found.outputs, list)
    paths = [*found.candidates, *found.outputs] if lists else []
    well_formed = (
        lists
        and all(isinstance(v, str) for v in (found.key, found.reference, found.stage, found.output))
        and found.output in OUTPUTS
        and (found.rule is None or (isinstance(found.rule, str) and found.rule in RULES))
        and (found.rule is None or isinstance(found.metric, str))
        and len(found.candidates) == len(found.outputs) >= 1
        and all(_safe_path(p) for p in paths)
    )
    if not well_formed:
        raise ConfigError(Problem("not an input hpcrl wrote", file=file, key=where))
    return found


def _safe_path(path: Any) -> bool:
    return isinstance(path, str) and os.path.isabs(path) and "\0" not in path and ".." not in Path(path).parts


def bind_inputs(run_dir: Path, inputs: list[Input], values: dict[str, Any]) -> dict[str, Any]:
    """The config values of the element's inputs (dotted key -> value), chosen and verified (see the
    module docstring); `inputs`: read_inputs(run_dir); `values`: each input key's value in the config,
    holding the reference text."""
    if not inputs:
        return {}
    selected = _selected(run_dir)
    verified = _read_json(run_dir / VERIFIED)
    stamps: dict[str, Any] = {}
    bound: dict[str, Any] = {}
    for item in inputs:
        chosen = _choose(item, selected)
        if item.output == "hf":
            problem, stamps[chosen] = check_export(Path(chosen), verified.get(chosen))
            if problem:
                raise ConfigError(
                    Problem(f"the export of stage {item.stage} cannot be used: {problem}", key=item.key)
                )
        current = bound.get(item.key, values.get(item.key))
        if not isinstance(current, str) or item.reference not in current:
            raise ConfigError(Problem(f"the config does not hold {item.reference}", key=item.key))
        bound[item.key] = current.replace(item.reference, chosen)
    if selected.get("changed"):
        selected.pop("changed")
        atomic_write(run_dir / SELECTED, json.dumps(selected, indent=1))
    if stamps and stamps != verified:
        atomic_write(run_dir / VERIFIED, json.dumps(stamps))
    return bound


def _selected(run_dir: Path) -> dict[str, Any]:
    return _read_json(run_dir / SELECTED)


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object this element wrote earlier; anything else (absent, garbage, a link): empty."""
    try:
        data = json.loads(read_capped(path, MAX_BYTES, follow_symlinks=False).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _choose(item: Input, selected: dict[str, Any]) -> str:
    """The output path of the candidate the rule picks (the only one without a rule); a choice recorded
    by an earlier attempt stands."""
    if item.rule is None:
        return item.outputs[0]
    earlier = selected.get(item.reference)
    if isinstance(earlier, dict) and earlier.get("output") in item.outputs:
        return earlier["output"]
    scores = [(last_value(Path(run), item.metric or ""), n) for n, run in enumerate(item.candidates)]
    scored = [(score, n) for score, n in scores if score is not None]
    if not scored:
        message = f"{item.reference}: no element of stage {item.stage} logged {item.metric}"
        raise ConfigError(Problem(message, key=item.key))
    highest = RULES[item.rule] is max  # ties: the lowest index, either way
    score, n = RULES[item.rule](scored, key=lambda pair: (pair[0], -pair[1] if highest else pair[1]))
    selected[item.reference] = {
        "element": n,
        "run_dir": item.candidates[n],
        "output": item.outputs[n],
        "metric": item.metric,
        "value": score,
        "scores": {str(i): s for s, i in scores},
    }
    selected["changed"] = True
    return item.outputs[n]


def last_value(run_dir: Path, metric: str) -> float | None:
    """The last finite value of `metric` in the run's metrics.jsonl (None: never logged)."""
    try:  # a regular file of bounded size: a FIFO there must not hang the start of the consumer
        raw = read_capped(run_dir / "metrics.jsonl", MAX_METRICS_BYTES, follow_symlinks=False)
    except (OSError, ValueError):
        return None
    found = []
    for record in step_records(raw.splitlines()):
        value = record.get(metric)
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                found.append(float(value))
            except OverflowError:  # a 400-digit integer
                continue
    finite = [v for v in found if math.isfinite(v)]
    return finite[-1] if finite else None
