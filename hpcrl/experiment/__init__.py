"""One experiment element: `ExperimentConfig` composes every component's config (config.py), the rules
across components (rules.py) and a template's resolution into its sweep's elements (resolve.py)."""
