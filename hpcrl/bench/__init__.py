"""Benchmarks as one system: the result schema (hpcrl.bench.records), the suite runner (hpcrl.bench.runner),
the report (hpcrl.bench.report), `hpcrl bench run|report` (hpcrl.cli.bench), and the planner-vs-measured
and RL-step-breakdown benchmark programs (hpcrl.bench.memory_check, hpcrl.bench.rl_breakdown)."""
