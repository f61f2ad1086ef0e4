"""`hpcrl rehearse`: run a GPU recipe on CPU before spending GPU hours.

| file         | role                                                                                    |
|--------------|-----------------------------------------------------------------------------------------|
| derive.py    | the rehearsal's config: the recipe's layout, placement, dtype, backends, algorithm and checkpoint cadence kept; model, data and sizes shrunk, each change a note (pure, torch-free) |
| report.py    | what a rehearsal must show, read off its metrics.jsonl: every step once across the resume, weights moved every step, the reshard's bytes = the bound, the weight sync verified |
| workdir.py   | one rehearsal's directory: the element's rehearsal, its identity (same run, run once), rehearsal.yaml and the tiny HF model written, the report read back with the planned sync bytes |

The command (hpcrl.cli.rehearse) parses, runs the derived config twice through the local launcher (save,
then resume; the launcher sits above this package) and prints the report with the full-size job's
memory plan.
"""
