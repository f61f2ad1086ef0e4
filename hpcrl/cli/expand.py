"""`hpcrl expand TEMPLATE [overrides]`: the table of resolved configs (index, id, swept values)."""

from __future__ import annotations

import json
import sys

from hpcrl.cli.common import (
    add_template_arguments,
    cell,
    element_record,
    overrides_from,
    print_config_if_asked,
)
from hpcrl.cli.pipeline import expand_pipeline
from hpcrl.experiment.resolve import resolve
from hpcrl.pipeline.spec import is_pipeline_file
from hpcrl.progress import DelayedProgress

HELP = "Resolve a template (and its sweep) and print every element: index, config id, swept values."


def add_arguments(parser) -> None:
    add_template_arguments(parser)
    parser.add_argument(
        "--json", action="store_true", help="One JSON object per element, with its full config."
    )


TABLE_ROWS = 1000
"""Largest sweep shown as a rich table; a larger one is printed as aligned plain lines, one per element,
as it is made (rich lays out a whole table in memory first: minutes and ~GBs for 100,000 rows)."""


def main(args) -> int:
    if is_pipeline_file(args.template):
        return expand_pipeline(args)
    with DelayedProgress() as track:
        sweep = resolve(args.template, overrides_from(args), track=track)
    if print_config_if_asked(args, sweep):
        return 0
    if args.json:
        for e in sweep.elements:
            sys.stdout.write(json.dumps(element_record(e)) + "\n")
        return 0
    if len(sweep.elements) > TABLE_ROWS:
        _print_lines(sweep)
    else:
        _print_table(sweep)
    return 0


def _print_table(sweep) -> None:
    from rich.console import Console
    from rich.table import Table

    # cells, not str: rich reads "[...]" in a str as markup (a "[/]" would raise), and a value is data
    table = Table(title=cell(f"{sweep.template}: {len(sweep.elements)} config(s)"))
    for column in ("index", "id", *sweep.keys):
        table.add_column(cell(column), justify="right" if column == "index" else "left")
    for e in sweep.elements:
        table.add_row(str(e.index), e.config_id, *(cell(e.swept.get(k, "")) for k in sweep.keys))
    Console(width=200).print(table)


def _print_lines(sweep) -> None:
    """The same columns as plain aligned text, each line written when its element is made. The widths
    come from the plan (every value a key takes), so no element is made twice. Values are printable
    text already (the config text rule): written as they are."""
    n = len(sweep.elements)
    widths = [len(str(n - 1)), len(sweep.elements.ids[0])]
    widths += [max(len(key), *(len(str(v)) for v in sweep.plan.values(key))) for key in sweep.keys]
    print(f"{sweep.template}: {n} config(s)")
    print(_line(("index", "id", *sweep.keys), widths))
    for e in sweep.elements:
        sys.stdout.write(
            _line((e.index, e.config_id, *(e.swept.get(k, "") for k in sweep.keys)), widths) + "\n"
        )


def _line(cells, widths: list[int]) -> str:
    return "  ".join(f"{cell!s:<{width}}" for cell, width in zip(cells, widths, strict=True)).rstrip()
