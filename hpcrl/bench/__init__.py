"""Benchmarks as one system: the result schema (hpcrl.bench.records), the suite runner (hpcrl.bench.runner)
and the report (hpcrl.bench.report); `hpcrl bench run|report` is hpcrl.cli.bench. The benchmark programs
themselves live in the repository's `benchmarks/` folder only."""
