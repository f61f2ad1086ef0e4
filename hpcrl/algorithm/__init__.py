"""The RL algorithm as config: `AlgorithmConfig` (config.py) and the registry of what each algorithm
needs (registry.py: critic, samples per prompt, greedy baseline, ...), below everything that reads them."""
