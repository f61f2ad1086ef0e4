"""An entrypoint that reports how its rank was started: `tests.launcher._fork_probe:main` writes
`<run_dir>/rank_<r>.json` with its pid, parent, process group, command line and whether megatron-core was
imported before the entrypoint ran (it never imports it itself)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(cfg, run_dir: Path, lifecycle=None) -> None:
    rank = int(os.environ["RANK"])
    report = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "cmdline": Path("/proc/self/cmdline").read_bytes().decode().split("\0")[:-1],
        "megatron_preloaded": "megatron.core" in sys.modules,
        "rank_env": [os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")],
    }
    (Path(run_dir) / f"rank_{rank}.json").write_text(json.dumps(report))
