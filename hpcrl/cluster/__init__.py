"""The cluster an element runs on, as config: `ClusterConfig`, the trusted profiles it is built from and
its own rules. Pure (no Slurm calls): the launcher renders and submits, hpcrl.config composes."""
