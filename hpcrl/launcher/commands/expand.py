"""`hpcrl expand TEMPLATE [overrides]`: the table of resolved configs (index, id, swept values)."""

from __future__ import annotations

import json

from hpcrl.launcher.cli_common import add_template_arguments, overrides_from, print_config_if_asked

HELP = "Resolve a template (and its sweep) and print every element: index, config id, swept values."


def add_arguments(parser) -> None:
    add_template_arguments(parser)
    parser.add_argument(
        "--json", action="store_true", help="One JSON object per element, with its full config."
    )


def main(args) -> int:
    from hpcrl.config.resolve import resolve

    sweep = resolve(args.template, overrides_from(args))
    if print_config_if_asked(args, sweep):
        return 0
    if args.json:
        for e in sweep.elements:
            print(
                json.dumps(
                    {
                        "index": e.index,
                        "config_id": e.config_id,
                        "swept": e.swept,
                        "run_dir": str(e.run_dir),
                        "config": e.data,
                    }
                )
            )
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Text, not str: rich reads "[...]" in a str as markup, and a value is data (a "[/]" would raise).
    table = Table(title=Text(f"{sweep.template}: {len(sweep.elements)} config(s)"))
    for column in ("index", "id", *sweep.keys):
        table.add_column(Text(column), justify="right" if column == "index" else "left")
    for e in sweep.elements:
        table.add_row(str(e.index), e.config_id, *(Text(str(e.swept.get(k, ""))) for k in sweep.keys))
    Console(width=200).print(table)
    return 0
