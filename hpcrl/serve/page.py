"""The sweep page: a Dash app (Flask, Plotly, React; every asset served from the installed packages, no
CDN) that shows hpcrl.serve.view's snapshot and refreshes it every `refresh_s` seconds. It changes
nothing: no callback writes, and the only thing a request names is a metric, a swept key and an element
index, each checked against what the sweep has. Text from the sweep (swept values, reasons, logs) goes
into the page as text nodes, which React escapes: a value is never markup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcrl.errors import ClusterError, ConfigError
from hpcrl.launcher.sweep_manifest import load_manifest
from hpcrl.serve.view import SweepView, log_tail, logged_metrics, read_view

COLUMNS = ("index", "id", "state", "reason", "restarts", "step")
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")


def build_app(sweep_dir: str | Path, refresh_s: float = 2.0) -> Any:
    """The Dash app of one sweep (its Flask server is `app.server`)."""
    from dash import Dash, Input, Output, dcc, html, no_update

    sweep_dir = str(sweep_dir)
    first = read_view(sweep_dir, None, None)
    metrics = sorted({first.metric, *logged_metrics(load_manifest(sweep_dir))})
    app = Dash(__name__, title=f"hpcrl: {first.name}", serve_locally=True, update_title=None)
    app.layout = html.Div(
        [
            html.H2(f"{first.name}", id="title"),
            html.Div(first.sweep_dir, id="sweep-dir", style={"color": "#666"}),
            html.Div(id="summary", style={"margin": "8px 0"}),
            html.Div(
                [
                    html.Label("metric "),
                    dcc.Dropdown(
                        metrics, first.metric, id="metric", clearable=False, style={"width": "320px"}
                    ),
                    html.Label(" colour by "),
                    dcc.Dropdown(first.keys, first.by, id="by", style={"width": "240px"}),
                ],
                style={"display": "flex", "gap": "8px", "alignItems": "center"},
            ),
            dcc.Graph(id="curves"),
            html.Table(id="elements", style={"borderCollapse": "collapse", "fontFamily": "monospace"}),
            html.H4("log"),
            dcc.Dropdown(
                [r.index for r in first.rows],
                0 if first.rows else None,
                id="log-index",
                clearable=False,
                style={"width": "120px"},
            ),  # fmt: skip
            html.Pre(
                id="log",
                style={
                    "maxHeight": "400px",
                    "overflow": "auto",
                    "background": "#f6f6f6",
                    "whiteSpace": "pre-wrap",
                },
            ),
            dcc.Interval(id="tick", interval=int(refresh_s * 1000)),
        ],
        style={"fontFamily": "sans-serif", "margin": "16px"},
    )

    @app.callback(
        Output("summary", "children"),
        Output("elements", "children"),
        Output("curves", "figure"),
        Output("log", "children"),
        Input("tick", "n_intervals"),
        Input("metric", "value"),
        Input("by", "value"),
        Input("log-index", "value"),
    )
    def refresh(_tick, metric, by, log_index):
        index = log_index if isinstance(log_index, int) else 0
        try:
            view = read_view(sweep_dir, metric if metric in metrics else None, by)
        except (
            ConfigError,
            ClusterError,
        ) as err:  # a manifest being rewritten, sacct down: say it, keep the rest
            return f"cannot read the sweep now: {err}", no_update, no_update, no_update
        return summary(view), table(view, html), figure(view), log_tail(sweep_dir, index)

    return app


def summary(view: SweepView) -> str:
    counts: dict[str, int] = {}
    for row in view.rows:
        counts[row.state] = counts.get(row.state, 0) + 1
    states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return f"{len(view.rows)} elements: {states}" + "".join(f"; note: {n}" for n in view.notes)


def table(view: SweepView, html: Any) -> list:
    """The element table; each cell has an id (`state-3`, `step-3`, ...) a test can find."""
    header = [*COLUMNS, f"last {view.metric}", *view.keys]
    cell = {"border": "1px solid #ccc", "padding": "2px 6px"}
    rows = [html.Tr([html.Th(name, style=cell) for name in header])]
    for row in view.rows:
        values = (
            row.index,
            row.config_id,
            row.state,
            row.reason,
            row.restarts,
            _text(row.step),
            _text(row.last),
        )
        names = (*COLUMNS, "last")
        cells = [
            html.Td(str(v), id=f"{name}-{row.index}", style=cell)
            for name, v in zip(names, values, strict=True)
        ]
        cells += [html.Td(row.swept[key], style=cell) for key in view.keys]
        rows.append(html.Tr(cells))
    return rows


def figure(view: SweepView) -> dict:
    """One line per element, coloured by its group (the `by` key's value; by element when there is one
    group: a sweep over seeds alone), the metric against the step."""
    groups = view.groups()
    colours = {group: PALETTE[i % len(PALETTE)] for i, group in enumerate(groups)}
    traces = []
    for row, curve in zip(view.rows, view.curves, strict=True):
        colour = colours[row.group] if len(groups) > 1 else PALETTE[row.index % len(PALETTE)]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": curve.steps,
                "y": curve.values,
                "name": f"{row.index} {row.group}",
                "line": {"color": colour},
                "legendgroup": row.group,
            }
        )
    layout = {
        "xaxis": {"title": {"text": "step"}},
        "yaxis": {"title": {"text": view.metric}},
        "uirevision": f"{view.metric}:{view.by}",  # keep the user's zoom across refreshes
        "margin": {"t": 20},
    }
    return {"data": traces, "layout": layout}


def _text(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)
