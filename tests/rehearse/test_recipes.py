"""The rehearsal tier: `hpcrl rehearse` on every GPU recipe and GPU benchmark template, as a user runs it.

Each rehearsal runs the recipe's layout on gloo (up to 8 ranks), its dtype, megatron's DDP + distributed
optimizer, its rollout engine as a GPU element resolves it, its algorithm, a save and a resume, with
every weight sync verified (hpcrl.rehearse). The GPU recipes (templates/gpu/) are rehearsed whole; a
benchmark sweep (templates/bench/gpu/) by its first element at 4 ranks, to fit CI's budget on 2 cores:
its other elements differ in layout sizes, which `hpcrl rehearse TEMPLATE` runs one by one (README).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.experiment.resolve import resolve
from hpcrl.rehearse.derive import STEPS
from hpcrl.rehearse.workdir import rehearsal_identity, rehearsal_of
from hpcrl.rollout.engine_rule import vllm_device

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "templates" / "gpu").glob("*.yaml"))
BENCH = sorted(
    p for p in (REPO / "templates" / "bench" / "gpu").glob("*.yaml") if not p.stem.endswith("-base")
)
BENCH_MAX_RANKS = 4


def _first_rehearsal(template: Path) -> str:
    """What makes the rehearsal of `template`'s first element at BENCH_MAX_RANKS ranks the run it is."""
    element = resolve(template, {}).elements[0]
    rehearsal = rehearsal_of(element, Path("r"), None, STEPS, BENCH_MAX_RANKS, vllm_device() == "cpu")
    return rehearsal_identity(element.data, rehearsal)


def _distinct(templates: list[Path]) -> dict[Path, Path]:
    """Each template -> the first template whose first rehearsal is the same run (itself if none)."""
    first_with: dict[str, Path] = {}
    return {t: first_with.setdefault(_first_rehearsal(t), t) for t in templates}


BENCH_SAME_AS = _distinct(BENCH)
"""Today hybridflow-7b's first element shrinks to hybridflow-13b's (t=2,d=2 -> t_g=2, the same tiny
model): one rehearsal covers both, as `hpcrl rehearse` itself runs identical rehearsals once."""

pytestmark = [pytest.mark.slow, pytest.mark.dist]


def _rehearse(template: Path, tmp_path: Path, *extra: str) -> str:
    hpcrl = Path(sys.executable).with_name("hpcrl")
    proc = subprocess.run(
        [str(hpcrl), "rehearse", str(template), "--dir", str(tmp_path / "r"), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    return out


@pytest.mark.heavy
@pytest.mark.parametrize("template", RECIPES, ids=lambda p: p.name)
def test_every_gpu_recipe_rehearses_on_cpu(template, tmp_path):
    out = _rehearse(template, tmp_path)
    assert "PASS" in out and "FAIL" not in out, out
    assert "optim.backend auto -> megatron" in out and "weights moved yes" in out


@pytest.mark.heavy
@pytest.mark.parametrize("template", sorted(set(BENCH_SAME_AS.values())), ids=lambda p: p.name)
def test_every_gpu_benchmark_template_rehearses_on_cpu(template, tmp_path):
    """Each distinct first-element rehearsal once (BENCH_SAME_AS)."""
    out = _rehearse(template, tmp_path, "--index", "0", "--max_ranks", str(BENCH_MAX_RANKS))
    assert "PASS" in out and "FAIL" not in out, out
