"""Pipelines: stages (SFT, reward model, RL, ...) chained as dependent jobs, each an experiment template."""
