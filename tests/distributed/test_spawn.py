import pytest

from hpcrl.distributed.spawn import RankFailed, run_ranks
from tests.distributed._rank_fns import all_reduce_rank, failing_rank, megatron_fuser_names

pytestmark = pytest.mark.dist


def test_all_reduce_over_four_gloo_ranks():
    assert run_ranks(all_reduce_rank, 4) == [10.0, 10.0, 10.0, 10.0]


def test_a_failing_rank_is_reported_with_its_traceback():
    with pytest.raises(RankFailed, match="boom on rank 1"):
        run_ranks(failing_rank, 2)


def test_ranks_come_from_a_fork_server_whose_megatron_compiled_no_fusions():
    """The fork server imports megatron-core after turning its fusions off (PRELOAD): on CPU they cannot
    help, and compiling them through torch dynamo cost ~2.5 s of CPU in every test and benchmark process."""
    import torch

    expected = "compile" if torch.cuda.is_available() else "noop_decorator"
    assert run_ranks(megatron_fuser_names, 1) == [[expected, expected]]
