"""Benchmark: the memory planner's prediction vs the measured peak of the actor's update steps (CPU).

    python -m benchmarks.memory_check --results-dir DIR [--template T.yaml] [--set key=value ...]

One record per run: metric `actor_update_peak_bytes`, value = measured peak of live tensor bytes
(torch memory profiler, hpcrl.plan.measure), baseline `planner_prediction` = MemoryPlan.update_peak
(so ratio = measured / predicted; the goal is within 25%). `extra` holds the RSS-based cross-check
(peak RSS minus the same process's RSS before the model was built) and every predicted component.
With several TP/PP ranks the worst rank is recorded.
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_sets(items: list[str]) -> dict:
    """`key=value` pairs (value read as YAML) -> overrides for hpcrl.experiment.resolve."""
    from hpcrl.config.yaml_io import loads_yaml
    from hpcrl.errors import ConfigError, Problem

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(Problem(f"expected key=value, got {item!r}", "command line", "--set"))
        out[key] = loads_yaml(value, f"--set {key}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", default=str(Path.cwd() / "results"))
    parser.add_argument("--template", default=str(REPO / "templates" / "grpo_tiny.yaml"))
    parser.add_argument("--set", action="append", default=[], help="dotted.key=value override (repeatable)")
    parser.add_argument("--label", default=None, help="model_size label (default: parameter count)")
    parser.add_argument("--steps", type=int, default=2, help="profiled update steps (after one warm-up)")
    args = parser.parse_args(argv)

    from hpcrl.bench.records import Record, write_records
    from hpcrl.experiment.resolve import resolve
    from hpcrl.plan.formulas import rank_params
    from hpcrl.plan.measure import measure_update_peak
    from hpcrl.plan.memory import dims_of, predict

    cfg = resolve(args.template, parse_sets(args.set)).elements[0].config
    plan = predict(cfg)
    ranks = measure_update_peak(cfg, steps=args.steps)
    worst = max(ranks, key=lambda r: r["tensor_peak_bytes"])
    total_params = rank_params(dims_of(cfg), 1, 1).total
    record = Record(
        benchmark="memory",
        metric="actor_update_peak_bytes",
        value=worst["tensor_peak_bytes"],
        unit="B",
        baseline_name="planner_prediction",
        baseline_value=plan.update_peak,
        repetitions=len(ranks),
        samples=[r["tensor_peak_bytes"] for r in ranks],
        layout=plan.layout,
        model_size=args.label or f"{total_params / 1e6:.3g}M params {cfg.model.dtype}",
        extra={
            "value_label": "measured",
            "rss_delta_bytes": max(r["rss_delta_bytes"] for r in ranks),
            "rss_steady_bytes": max(r.get("rss_steady_bytes", float("nan")) for r in ranks),
            "params_on_rank": worst["params_on_rank"],
            "error_vs_prediction": worst["tensor_peak_bytes"] / plan.update_peak - 1,
            "components": {c.name: c.bytes for c in plan.components},
            "overrides": args.set,
        },
    )
    write_records(args.results_dir, [record])
    print(
        f"memory {record.model_size} {plan.layout}: measured {record.value / 2**20:.2f} MiB, "
        f"predicted {record.baseline_value / 2**20:.2f} MiB ({record.extra['error_vs_prediction']:+.1%}); "
        f"RSS delta {record.extra['rss_delta_bytes'] / 2**20:.1f} MiB, "
        f"steady-state RSS {record.extra['rss_steady_bytes'] / 2**20:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
