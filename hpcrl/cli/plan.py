"""`hpcrl plan TEMPLATE [overrides]`: predicted per-rank memory of every element of a template.

Prints one table per element (component, phase, bytes, formula) with the device peak against one
accelerator of the cluster profile (A100 80GB when unnamed) and host RAM per rank. Exit 0 when every
element is predicted to fit, 1 when one is not (the problems are listed), 2 on config errors.
Model dims come from `model.hf_path`'s config.json where it is readable here (the template's own values
checked against it), else from the template alone (hpcrl.train.hf_config). A pipeline file: every stage,
each with the model it starts from (an upstream stage's export: that stage's model, hpcrl.pipeline.plan).
"""

from __future__ import annotations

import json

from hpcrl.cli.common import add_template_arguments, overrides_from
from hpcrl.experiment.resolve import resolve
from hpcrl.pipeline.plan import plan_pipeline
from hpcrl.pipeline.spec import is_pipeline_file
from hpcrl.plan.stages import plan_of

HELP = "Predict per-rank accelerator memory and host RAM of a template's configs (memory preflight)."


def add_arguments(parser) -> None:
    add_template_arguments(parser)
    parser.add_argument("--json", action="store_true", help="One JSON object per element instead of tables.")


def human(num_bytes: float) -> str:
    """Bytes as B / KiB / MiB / GiB with 3 significant digits."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.3g} {unit}" if unit != "B" else f"{value:.0f} B"
        value /= 1024
    raise AssertionError("unreachable")


def plan_table(plan, title: str):
    """A rich Table of one MemoryPlan."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("component", "phase", "pool", "per rank", "formula"):
        table.add_column(column, justify="right" if column == "per rank" else "left")
    for c in plan.components:
        table.add_row(c.name, c.phase, c.pool, human(c.bytes), c.formula)
    fits_device = plan.device.kind == "cpu" or plan.device_peak <= plan.device.bytes
    table.add_section()
    table.add_row(
        "device peak",
        "persistent + max(phase)",
        "worst",
        human(plan.device_peak),
        f"{'fits' if fits_device else 'DOES NOT FIT'} {plan.device.name} ({human(plan.device.bytes)})",
    )
    table.add_row(
        "host RAM peak",
        "host (+ device on CPU)",
        "",
        human(plan.host_peak),
        f"{'fits' if plan.host_peak <= plan.host.bytes else 'DOES NOT FIT'} {plan.host.name}",
    )
    return table


def main(args) -> int:
    from rich.console import Console

    if is_pipeline_file(args.template):  # each stage, with the model it starts from (an upstream export's)
        pipeline = plan_pipeline(args.template, overrides_from(args))
        stages = [(f"stage {s.name}: ", {"stage": s.name}, s.sweep, s.checked_as) for s in pipeline.stages]
    else:
        sweep = resolve(args.template, overrides_from(args))
        stages = [("", {}, sweep, sweep)]
    console = Console(width=200)
    problems: list[str] = []
    for label, tag, sweep, checked_as in stages:
        for element, planned in zip(sweep.elements, checked_as.elements, strict=True):
            plan = plan_of(planned.config)
            where = f"{label}element {element.index} ({element.config_id})"
            problems += [f"{where}: {p}" for p in plan.problems()]
            if args.json:
                print(json.dumps(tag | _as_json(element, plan)))
            else:
                title = f"{label}{sweep.template} [{element.index}] {element.config_id} {plan.layout}"
                console.print(plan_table(plan, title))
    errors = Console(stderr=True, width=200) if args.json else console  # keep --json stdout pure JSON
    for problem in problems:
        errors.print(f"[bold red]predicted not to fit:[/] {problem}")
    return 1 if problems else 0


def _as_json(element, plan) -> dict:
    return {
        "index": element.index,
        "config_id": element.config_id,
        "layout": plan.layout,
        "device": {"name": plan.device.name, "bytes": plan.device.bytes, "peak": plan.device_peak},
        "host": {"name": plan.host.name, "bytes": plan.host.bytes, "peak": plan.host_peak},
        "fits": plan.fits,
        "components": [
            {"name": c.name, "phase": c.phase, "bytes": c.bytes, "formula": c.formula}
            for c in plan.components
        ],
    }
