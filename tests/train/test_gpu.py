"""The GPU path of the training worker (CUDA + NCCL): skipped on machines without a GPU."""

import pytest

from hpcrl.distributed.spawn import run_ranks
from tests.train import _rank_fns as fns

pytestmark = [pytest.mark.gpu, pytest.mark.dist]


def test_on_cuda_the_compat_layer_stays_off_and_an_update_runs_on_the_gpu():
    (result,) = run_ranks(fns.cuda_update, 1, backend="nccl")
    assert result["patches"] == ()
    assert result["device"].startswith("cuda")
    assert result["weights_moved"]
