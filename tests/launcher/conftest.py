"""The A100-shaped Slurm cluster (slurm/a100/start.sh: two 8xA100 nodes of 64 CPUs, partition `gpu`
with MaxTime 2 days, no accounting), for the launcher tests that need GPU-shaped scheduling.

`a100_cluster` points SLURM_CONF at it for one test (the dev cluster's `slurm_cluster` keeps it for
the session: the two run side by side). Absent cluster: pytest.fail when HPCRL_REQUIRE_SLURM=1
(launch/test.sh starts it, so CI never passes by skipping), else skip, saying how to start it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def a100_state_dir() -> Path:
    """As slurm/a100/start.sh: $HPCRL_A100_DIR, else <repo>/.slurm-a100."""
    return Path(os.environ.get("HPCRL_A100_DIR") or REPO / ".slurm-a100")


@pytest.fixture
def a100_cluster(monkeypatch):
    from tests.slurm.cluster import ClusterAbsent, SlurmCluster

    try:
        cluster = SlurmCluster.load(a100_state_dir())
    except ClusterAbsent as err:
        why = f"the A100-shaped Slurm cluster is absent (start it: bash slurm/a100/start.sh): {err}"
        if os.environ.get("HPCRL_REQUIRE_SLURM") == "1":
            pytest.fail(f"HPCRL_REQUIRE_SLURM=1 but {why}", pytrace=False)
        pytest.skip(why)
    monkeypatch.setenv("SLURM_CONF", str(cluster.slurm_conf))
    return cluster
