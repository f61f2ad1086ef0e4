"""One module per stage kind: its own config section (a dataclass documented field by field), that
section's rules and its `KIND` (hpcrl.experiment.kinds.kind.StageKind: entrypoint, headline, step key,
memory shape). hpcrl.experiment.config registers each kind and composes its section into the
ExperimentConfig; the trainer lives in hpcrl.rl (rl) or hpcrl.posttrain (the offline stages).

Adding a stage is three files: its trainer, its module here, and its line in hpcrl.experiment.config.
"""
