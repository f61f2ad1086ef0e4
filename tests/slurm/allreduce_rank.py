"""One rank of a job that forms the default process group from its launcher's environment.

Run as `python -m tests.slurm.allreduce_rank` under srun (Slurm env) or with torchrun-style variables.
Each rank all-reduces (rank + 1) and prints one JSON line: what it read from the environment and the sum.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from hpcrl.distributed.env import DistEnv, init_process_group


def main() -> None:
    torch.set_num_threads(1)
    env = DistEnv.from_environ()
    group = init_process_group(env, backend="auto", timeout_s=120)  # a guard on the rendezvous
    try:
        value = torch.tensor([float(env.rank + 1)])
        dist.all_reduce(value, group=group)
        record = {
            "rank": env.rank,
            "world_size": env.world_size,
            "local_rank": env.local_rank,
            "node_rank": env.node_rank,
            "local_world_size": env.local_world_size,
            "node_name": env.node_name,
            "slurmd_nodename": os.environ.get("SLURMD_NODENAME"),
            "master": f"{env.master_addr}:{env.master_port}",
            "source": env.source,
            "backend": dist.get_backend(group),
            "sum": value.item(),
        }
    finally:
        dist.destroy_process_group()
    print("RESULT " + json.dumps(record, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
