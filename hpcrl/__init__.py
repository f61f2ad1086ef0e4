"""hpcrl: RL post-training of LLMs on Slurm clusters, the HybridFlow way."""

__version__ = "0.1.0"
