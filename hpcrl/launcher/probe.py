"""A real, tiny entrypoint for launcher tests and cluster smoke checks: `hpcrl.launcher.probe:main`.

Every rank joins one all-reduce and one all-gather of node names; rank 0 writes `<run_dir>/probe.json`
with the world size, the all-reduce result (sum of rank+1 = W(W+1)/2), the nodes, the config id it
computed from the config it received, and the values of the variables named in `cluster.env` as the
ranks saw them (so a test can prove env values arrive byte-exact and unevaluated).

Test knobs, read from the environment (set them through `cluster.env`):
  HPCRL_PROBE_SLEEP_S                      sleep this long after the collectives (cancel tests);
  HPCRL_PROBE_WAIT_FOR                     a file path: after the collectives, wait until it exists
                                           (a gate a test opens, so "not finished yet" is certain);
  HPCRL_PROBE_FAIL_FIRST_ATTEMPT_SEEDS     comma-separated seeds whose first attempt fails (resume tests).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from hpcrl.config.schema import to_dict
from hpcrl.config.yaml_io import atomic_write
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.ids import config_id
from hpcrl.experiment.stage_kinds import stage_data
from hpcrl.lifecycle import Lifecycle

RESULT = "probe.json"


def main(cfg: ExperimentConfig, run_dir: Path, lifecycle: Lifecycle | None = None) -> dict:
    """The probe saves nothing: it ignores the lifecycle (a stop signal ends it only by force)."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    nodes: list[str | None] = [None] * world
    dist.all_gather_object(nodes, os.environ.get("SLURMD_NODENAME") or socket.gethostname())
    _maybe_fail_first_attempt(cfg, run_dir, rank)
    time.sleep(float(os.environ.get("HPCRL_PROBE_SLEEP_S", "0")))
    _wait_for_gate()
    result = {
        "world_size": world,
        "all_reduce": total.item(),
        "expected_all_reduce": world * (world + 1) / 2,
        "nodes": nodes,
        "config_id": config_id(stage_data(to_dict(cfg))),  # an id hashes its stage's sections only
        "env": {key: os.environ.get(key) for key in cfg.cluster.env},
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "backend": dist.get_backend(),
    }
    dist.barrier()
    if rank == 0:
        atomic_write(run_dir / RESULT, json.dumps(result, indent=1), fsync=False)
    return result


def _wait_for_gate() -> None:
    gate = os.environ.get("HPCRL_PROBE_WAIT_FOR")
    while gate and not Path(gate).exists():  # no deadline: the test opens the gate or cancels the job
        time.sleep(0.2)


def _maybe_fail_first_attempt(cfg: ExperimentConfig, run_dir: Path, rank: int) -> None:
    seeds = os.environ.get("HPCRL_PROBE_FAIL_FIRST_ATTEMPT_SEEDS", "")
    if str(cfg.seed) not in seeds.split(","):
        return
    import torch.distributed as dist

    marker = run_dir / "probe.failed_once"
    first_attempt = not marker.exists()
    dist.barrier()  # every rank has looked before rank 0 writes the marker
    if not first_attempt:
        return
    if rank == 0:
        marker.write_text("failed on purpose (first attempt)\n")
    raise RuntimeError(f"probe: seed {cfg.seed} fails its first attempt on purpose")
