"""slurm/dev/start.sh on bad input: a taken port fails loudly, names the daemon and log, leaves nothing."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.slurm.cluster import REPO_ROOT

pytestmark = pytest.mark.slurm


def processes_mentioning(text: str) -> list[str]:
    """PIDs and command lines of live processes whose command line or environment mentions `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:  # exited meanwhile, or not ours to read
            continue
        if text.encode() in cmdline or text.encode() in environ:
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.name}: {command}")
    return found


def free_port_block(count: int) -> int:
    """First of `count` consecutive ports that nothing is bound to right now."""
    for base in range(18000, 19900, 10):
        try:
            socks = []
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free block of ports in 18000-19900")


@pytest.mark.heavy
def test_taken_slurmctld_port_fails_naming_slurmctld_and_its_log_and_leaves_nothing(slurm_cluster):
    # A short path: munged and MariaDB put unix sockets under it (108-byte limit).
    state = Path(tempfile.mkdtemp(prefix="hpcrl-slurm-", dir="/tmp"))
    base = free_port_block(8)
    ports = {
        "HPCRL_SLURMCTLD_PORT": base,
        "HPCRL_SLURMDBD_PORT": base + 1,
        "HPCRL_MARIADB_PORT": base + 2,
        "HPCRL_SLURMD_PORT": base + 4,
    }
    with socket.socket() as squatter:
        # Bound, not listening: the port looks free to a connect() probe, so slurmctld itself must fail.
        squatter.bind(("0.0.0.0", base))
        env = {**os.environ, "HPCRL_SLURM_DIR": str(state), **{k: str(v) for k, v in ports.items()}}
        env.pop("SLURM_CONF", None)
        proc = subprocess.run(
            ["bash", "slurm/dev/start.sh"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    try:
        assert proc.returncode != 0, proc.stdout
        assert "slurmctld failed" in proc.stderr
        assert f"{state}/log/slurmctld.log" in proc.stderr
        assert "Address already in use" in proc.stderr  # the log's last lines are shown
        assert processes_mentioning(str(state)) == []
        assert not (state / "cluster.json").exists()
        # The first instance is untouched.
        assert "UP" in slurm_cluster.run(["scontrol", "ping"]).stdout
    finally:
        subprocess.run(["bash", "slurm/dev/stop.sh"], cwd=REPO_ROOT, env=env, capture_output=True, timeout=60)
        subprocess.run(["rm", "-rf", str(state)], check=False)
