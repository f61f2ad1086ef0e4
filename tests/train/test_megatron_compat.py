"""The CPU compatibility layer: active on this CPU-only torch, a no-op when CUDA is reported present."""

import pytest

from hpcrl.distributed.spawn import run_ranks
from tests.train._rank_fns import compat_probe

pytestmark = pytest.mark.dist


def test_enable_patches_nothing_when_cuda_is_faked_available_and_runs_megatron_on_cpu_otherwise():
    (probe,) = run_ranks(compat_probe, 1)
    # No GPU here: CUDA presence is faked by patching torch.cuda.is_available inside the probe.
    assert probe["faked_cuda"] == {"returned": False, "patches": (), "current_device_untouched": True}
    assert probe["cpu"]["returned"] is True and probe["cpu"]["again"] is True
    assert probe["cpu"]["current_device"] == "cpu"
    assert len(probe["cpu"]["patches"]) == 3
    assert probe["tracker"] == "CpuRNGStatesTracker"
    assert probe["fork_streams_advance"]
    assert probe["logits_shape"] == (4, 8, 32)
