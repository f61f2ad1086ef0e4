"""One rehearsal's directory: what `hpcrl rehearse` writes before it launches and reads after.

    rehearsal = rehearsal_of(element, where, model, steps, max_ranks, vllm_here)   # hpcrl.rehearse.derive
    template = write_rehearsal(element, rehearsal, where)     # rehearsal.yaml (+ a tiny HF model)
    ... two launches of `template` into where/run (hpcrl.cli.rehearse: the launcher sits above this layer)
    report = read_report(element, rehearsal, where, steps)    # hpcrl.rehearse.report's checks

Elements whose rehearsals are the same run share one (`rehearsal_identity`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrl.cluster.profiles import NOT_IN_TEMPLATES
from hpcrl.config.schema import with_values
from hpcrl.config.yaml_io import canonical_json, dump_yaml
from hpcrl.distributed.layout import ParallelLayout
from hpcrl.distributed.placement import placement_of
from hpcrl.rehearse.derive import Rehearsal, derive
from hpcrl.rehearse.report import Report, check
from hpcrl.train.config import ARCHITECTURE_FIELDS, ModelConfig
from hpcrl.train.hf_config import ModelDimsUnavailable, with_hf_architecture

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig
    from hpcrl.experiment.elements import ResolvedConfig

TEMPLATE = "rehearsal.yaml"
"""The derived config, a plain template (`hpcrl run` reruns it)."""
RUN_DIR = "run"
"""The run directory both launches share."""


def launch_log(where: Path, launch: int) -> Path:
    """The output of launch 1 (the save) or 2 (the resume)."""
    return where / f"launch-{launch}.log"


def rehearsal_of(
    element: ResolvedConfig, where: Path, model: str | None, steps: int, max_ranks: int, vllm_here: bool
) -> Rehearsal:
    """The rehearsal of one sweep element, run under `where` (`model`: an HF directory at real size)."""
    return derive(
        _with_model(element.config, model),
        run_root=str(where / "runs"),
        model_dir=model or str(where / "model"),
        vllm_here=vllm_here,
        steps=steps,
        max_ranks=max_ranks,
        real_model=model is not None,
    )


def _with_model(cfg: ExperimentConfig, model_dir: str | None) -> ExperimentConfig:
    """The element with its model's architecture resolved: from `model_dir` (real size), from the
    recipe's own config.json where readable, else as the template spells it."""
    model = dataclasses.replace(cfg.model, hf_path=model_dir) if model_dir else cfg.model
    if model_dir:  # the directory's dims replace the recipe's
        model = dataclasses.replace(model, **dict.fromkeys(ARCHITECTURE_FIELDS))
    try:
        model = with_hf_architecture(model)
    except ModelDimsUnavailable:
        if model_dir:
            raise
    return dataclasses.replace(cfg, model=model)


def rehearsal_identity(data: dict, rehearsal: Rehearsal) -> str:
    """What makes two elements' rehearsals the same run (their paths and names aside)."""
    derived = with_values(
        data, {k: v for k, v in rehearsal.overrides.items() if k not in ("run_root", "model.hf_path")}
    )
    derived.pop("name", None)
    return canonical_json(derived)


def write_rehearsal(element: ResolvedConfig, rehearsal: Rehearsal, where: Path, *, real_model: bool) -> Path:
    """Create `where` (it must not exist) with the rehearsal's template and, unless it rehearses a real
    model, the tiny HF directory it names; return the template."""
    where.mkdir(parents=True, exist_ok=False)
    data = with_values(element.data, rehearsal.overrides)
    for key in NOT_IN_TEMPLATES:  # a profile's or the command line's, and the rehearsal has neither
        data["cluster"].pop(key, None)
    template = where / TEMPLATE
    template.write_text(dump_yaml(data))
    if rehearsal.model_dir and not real_model:
        _write_tiny_model(rehearsal, Path(rehearsal.overrides["model.hf_path"]), element.config.model.dtype)
    return template


def read_report(element: ResolvedConfig, rehearsal: Rehearsal, where: Path, steps: int) -> Report:
    """The checks of hpcrl.rehearse.report on the run's metrics and the resume's log."""
    metrics = (where / RUN_DIR / "metrics.jsonl").read_text()
    rows = [json.loads(line) for line in metrics.splitlines() if line]
    resume_log = launch_log(where, 2).read_text(errors="replace")
    return check(rows, steps, resume_log, planned_sync_bytes(element, rehearsal))


def _write_tiny_model(rehearsal: Rehearsal, out_dir: Path, dtype: str) -> None:
    # transformers and torch: only when a rehearsal runs (`hpcrl --help` imports every command module)
    from hpcrl.data.tokenizer import model_tokenizer
    from hpcrl.train.hf_dir import write_random_model

    cfg = ModelConfig(**rehearsal.model, dtype=dtype)
    write_random_model(cfg, out_dir, model_tokenizer(None, cfg.vocab_size))


def planned_sync_bytes(element: ResolvedConfig, rehearsal: Rehearsal) -> int | None:
    """Rank 0's planned receive bytes per weight sync (None on the async placement: its transfer is
    cross-pool, logged under weights/)."""
    if placement_of(element.config.placement).off_policy:
        return None
    # torch (through hpcrl.train.model's norm dtype rule): only when a rehearsal runs
    from hpcrl.reshard.build import model_param_metas
    from hpcrl.reshard.planner import plan_rank

    o = rehearsal.overrides
    sizes = {
        n: o[f"parallel.{n}"] for n in ("tensor", "pipeline", "data", "rollout_tensor", "rollout_pipeline")
    }
    model = ModelConfig(**rehearsal.model, dtype=element.config.model.dtype)
    return plan_rank(
        ParallelLayout(**sizes), model_param_metas(model, sizes["pipeline"]), 0, bucket_bytes=64 << 20
    ).lower_bound_bytes()
