import pytest

from hpcrl.distributed.spawn import RankFailed, run_ranks
from tests.distributed._rank_fns import all_reduce_rank, failing_rank

pytestmark = pytest.mark.dist


def test_all_reduce_over_four_gloo_ranks():
    assert run_ranks(all_reduce_rank, 4) == [10.0, 10.0, 10.0, 10.0]


def test_a_failing_rank_is_reported_with_its_traceback():
    with pytest.raises(RankFailed, match="boom on rank 1"):
        run_ranks(failing_rank, 2)
