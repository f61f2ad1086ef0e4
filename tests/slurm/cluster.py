"""A handle on the running dev Slurm cluster (slurm/dev/start.sh), for tests of every package.

Use it through the `slurm_cluster` fixture of tests/conftest.py:

    def test_something(slurm_cluster, tmp_path):
        job_id = slurm_cluster.sbatch(["--array=0-3", f"--output={tmp_path}/%a.out", "--wrap", "hostname"])
        states = slurm_cluster.wait_for_job(job_id, timeout_s=120, num_tasks=4)  # {"12_0": "COMPLETED", ...}

The fixture exports SLURM_CONF for the session, so submitit executors and plain `sbatch` reach this cluster.
Jobs run on this host: they may use the repository (`--chdir=REPO_ROOT`) and `sys.executable`.

`sacct` (slurmdbd + MariaDB) is the source of truth for finished jobs, as it is for submitit.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)
"""sacct states after which a job never runs again (REQUEUED is not one: the job goes back to PENDING)."""


class ClusterAbsent(RuntimeError):
    """The dev cluster is not running (or its state dir holds no cluster.json)."""


def state_dir() -> Path:
    """The dev cluster's state directory: $HPCRL_SLURM_DIR, else <repo>/.slurm-dev (as start.sh)."""
    return Path(os.environ.get("HPCRL_SLURM_DIR") or REPO_ROOT / ".slurm-dev")


@dataclass(frozen=True)
class SlurmCluster:
    """What start.sh wrote to <state_dir>/cluster.json, plus helpers to submit and wait."""

    slurm_conf: Path
    partition: str
    nodes: tuple[str, ...]
    state_dir: Path

    @classmethod
    def load(cls, directory: Path | None = None) -> SlurmCluster:
        """Read cluster.json and check that slurmctld answers; raise ClusterAbsent saying why not."""
        directory = directory or state_dir()
        info_path = directory / "cluster.json"
        if not info_path.is_file():
            raise ClusterAbsent(f"no {info_path}: start the dev cluster with `bash slurm/dev/start.sh`")
        info = json.loads(info_path.read_text())
        cluster = cls(
            slurm_conf=Path(info["slurm_conf"]),
            partition=info["partition"],
            nodes=tuple(info["nodes"]),
            state_dir=Path(info["state_dir"]),
        )
        try:
            ping = cluster.run(["scontrol", "ping"], check=False, timeout=60)
        except subprocess.TimeoutExpired:
            raise ClusterAbsent(
                f"`scontrol ping` for {info_path} hangs: restart with `bash slurm/dev/start.sh`"
            ) from None
        if ping.returncode != 0 or "UP" not in ping.stdout:
            raise ClusterAbsent(
                f"slurmctld of {info_path} does not answer `scontrol ping`: {ping.stdout.strip()} "
                f"{ping.stderr.strip()} (restart it with `bash slurm/dev/start.sh`)"
            )
        return cluster

    def environ(self) -> dict[str, str]:
        """os.environ with SLURM_CONF pointing at this cluster (for subprocesses)."""
        return {**os.environ, "SLURM_CONF": str(self.slurm_conf)}

    def run(self, argv: list[str], *, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; on failure the error shows its stderr."""
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=self.environ(), timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
        return proc

    def sbatch(self, args: list[str], *, cwd: Path | None = None) -> str:
        """Submit with `sbatch --parsable -p <partition> ...`; return the job id."""
        proc = subprocess.run(
            ["sbatch", "--parsable", f"--partition={self.partition}", *args],
            capture_output=True,
            text=True,
            env=self.environ(),
            cwd=cwd or REPO_ROOT,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch {args} failed (exit {proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def job_states(self, job_id: str) -> dict[str, str]:
        """{job id (array tasks as '12_3'): state} from sacct, allocations only (no steps)."""
        proc = self.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State"], check=False)
        states: dict[str, str] = {}
        for line in proc.stdout.splitlines():
            if "|" in line:
                jid, state = line.split("|", 1)
                states[jid] = state.split()[0] if state else ""  # "CANCELLED by 0" -> "CANCELLED"
        return states

    def active_tasks(self, job_id: str) -> list[str]:
        """squeue's pending/running/completing tasks of `job_id` (empty once the job is over)."""
        proc = self.run(["squeue", "-j", job_id, "-h", "-r", "-o", "%i %T"], check=False)
        return proc.stdout.split("\n") if proc.stdout.strip() else []

    def wait_for_job(
        self, job_id: str, timeout_s: float = 120.0, *, num_tasks: int | None = None, poll_s: float = 0.5
    ) -> dict[str, str]:
        """Wait until `job_id` is over (squeue) and sacct holds a terminal state for each task; return them.

        `num_tasks`: for an array job, how many tasks sacct must list. Raises TimeoutError with the last
        states seen and squeue's view after `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        active: list[str] = []
        while time.monotonic() < deadline:
            active = self.active_tasks(job_id)
            if not active:
                # slurmctld reports to slurmdbd asynchronously: sacct may lag squeue by a moment.
                states = self.job_states(job_id)
                complete = states and all(state in TERMINAL_STATES for state in states.values())
                if complete and (num_tasks is None or len(states) == num_tasks):
                    return states
            time.sleep(poll_s)
        raise TimeoutError(
            f"job {job_id} not finished after {timeout_s}s: sacct says {states or self.job_states(job_id)}, "
            f"squeue says {active}"
        )
