"""The CPU compatibility layer: active on this CPU-only torch (megatron forward, and with `enable_optimizer`
its DDP + distributed optimizer), a no-op when CUDA is reported present."""

import pytest

from hpcrl.distributed.spawn import run_ranks
from tests.train._rank_fns import compat_probe

pytestmark = pytest.mark.dist


def test_enable_patches_nothing_when_cuda_is_faked_available_and_runs_megatron_on_cpu_otherwise():
    (probe,) = run_ranks(compat_probe, 1)
    # No GPU here: CUDA presence is faked by patching torch.cuda.is_available inside the probe.
    assert probe["faked_cuda"] == {
        "returned": False,
        "patches": (),
        "current_device_untouched": True,
        "type_untouched": True,
    }
    cpu = probe["cpu"]
    assert cpu["returned"] is True and cpu["again"] is True
    assert cpu["current_device"] == "cpu"
    assert len(cpu["patches"]) == 3
    # the megatron optimizer on CPU: its 'cuda' scalars land on CPU, and only its own modules are told
    # that a bf16 CPU tensor is a 'torch.cuda.BFloat16Tensor' (how it sorts params into dtype groups)
    assert cpu["optimizer"] is True and cpu["optimizer_again"] is True
    assert cpu["all_patches"][-1] == "megatron.core.optimizer->cpu" and len(cpu["all_patches"]) == 4
    assert cpu["type_elsewhere"] == "torch.FloatTensor"
    assert cpu["type_in_megatron_optimizer"] == "torch.cuda.BFloat16Tensor"
    assert cpu["scalar_device"] == "cpu"
    assert probe["tracker"] == "CpuRNGStatesTracker"
    assert probe["fork_streams_advance"]
    assert probe["logits_shape"] == (4, 8, 32)


@pytest.mark.heavy
def test_fusions_off_keeps_torch_dynamo_out_of_a_process_that_imports_megatron():
    """Patch 6, in a fresh interpreter: megatron-core imported after `fusions_off_without_cuda()` has a
    no-op jit_fuser and never imported torch._dynamo; without the call it imports dynamo; called after
    megatron is imported it does nothing and says so."""
    import json
    import subprocess
    import sys

    probe = (
        "import json, sys\n"
        "from hpcrl.train.megatron_compat import fusions_off_without_cuda as off\n"
        "first = off() if sys.argv[1] == 'off' else None\n"
        "import megatron.core\n"
        "from megatron.core import jit\n"
        "from megatron.core.fusions import fused_bias_swiglu\n"
        "print(json.dumps([first, 'torch._dynamo' in sys.modules, jit.jit_fuser.__name__,\n"
        "  fused_bias_swiglu.jit_fuser.__name__, off()]))\n"
    )
    seen = {}
    for mode in ("off", "default"):
        out = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        seen[mode] = json.loads(out.stdout.splitlines()[-1])
    assert seen["off"] == [True, False, "noop_decorator", "noop_decorator", False]
    assert seen["default"][:2] == [None, True] and seen["default"][3] == "compile"
