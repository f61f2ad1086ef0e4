"""Cross-pool weight transfer on real multi-process gloo: bitwise shards and exact byte counts.

One 6-rank world runs three pool pairs in turn (ranks outside a pair's pools skip it, as `build` allows):
  A  t=2,d=1 (ranks 0,2)       -> t_g=1,d_r=2 (ranks 3,1): each receiver gets the whole model from both
                                  training TP ranks
  B  t=2,p=2 (ranks 0,1,2,4)   -> t_g=2 (ranks 5,3): a generation TP shard merges both training stages
  C  t=1,d=3 (ranks 5,1,2)     -> t_g=2 (ranks 0,4): the three replicas split the stream in thirds, so
                                  blocks are cut between senders and assembled on the receiver
Each runs two versions of random weights into the same receive buffers (the second must overwrite all).
"""

from __future__ import annotations

import pytest

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.distributed.spawn import RankFailed, run_ranks
from hpcrl.reshard.cross_pool import plan_cross_pool
from hpcrl.reshard.params import gpt_param_metas
from tests.reshard._cross_pool_rank_fns import silent_sender_rank, transfer_cases_rank
from tests.reshard._rank_fns import model_dims

pytestmark = pytest.mark.dist

ROUNDS = 2
CASES = {
    "A": (ParallelLayout(tensor=2), [0, 2], ParallelLayout(data=2), [3, 1]),
    "B": (
        ParallelLayout(tensor=2, pipeline=2),
        [0, 1, 2, 4],
        ParallelLayout(tensor=2, rollout_tensor=2),
        [5, 3],
    ),
    "C": (ParallelLayout(data=3), [5, 1, 2], ParallelLayout(tensor=2, rollout_tensor=2), [0, 4]),
}


@pytest.fixture(scope="module")
def results() -> dict[str, list]:
    by_rank = run_ranks(transfer_cases_rank, 6, list(CASES.values()), ROUNDS, timeout_s=240)
    return {name: [r[i] for r in by_rank] for i, name in enumerate(CASES)}


def _shard_bytes(case, rank: int) -> int:
    """A receiver's generation shard in bytes (fp32), from the metas alone."""
    train, _, gen, gen_ranks = case
    b = train.pipeline // gen.pipeline
    stage = gen.rollout_coords(gen_ranks.index(rank)).pipeline
    metas = gpt_param_metas(model_dims(), pipeline=train.pipeline)
    return 4 * sum(m.shard_numel(gen.tensor) for m in metas if m.stage // b == stage)


@pytest.mark.parametrize("name", list(CASES))
def test_receivers_get_their_generation_shard_bitwise_and_exactly_its_bytes(results, name):
    train, train_ranks, gen, gen_ranks = case = CASES[name]
    plan = plan_cross_pool(
        gpt_param_metas(model_dims(), pipeline=train.pipeline),
        train=train,
        train_ranks=train_ranks,
        gen=gen,
        gen_ranks=gen_ranks,
    )
    outs = results[name]
    assert [r is None for r in outs] == [r not in train_ranks + gen_ranks for r in range(6)]
    for rank in gen_ranks:
        out = outs[rank]
        assert out["wrong"] == [], f"receiver {rank}: {out['wrong']}"
        assert out["names"] == list(plan.receive_shapes(rank))
        exact = _shard_bytes(case, rank)
        assert out["bound"] == exact and out["moved"] == [exact] * ROUNDS
        assert (out["received"], out["sent"], out["calls"]) == (ROUNDS * exact, 0, ROUNDS)
    for rank in train_ranks:
        out = outs[rank]
        assert out["received"] == 0 and out["sent"] == sum(out["moved"]) and out["calls"] == ROUNDS
        assert max(out["moved"]) <= out["bound"]
    total = sum(outs[r]["sent"] for r in train_ranks)
    assert total == sum(outs[r]["received"] for r in gen_ranks) == ROUNDS * plan.bytes_bound(4)


def test_replicas_share_the_sending(results):
    """Case C: the three training replicas each send a third of the one stream (to one element)."""
    train_ranks = CASES["C"][1]
    sent = [results["C"][r]["sent"] for r in train_ranks]
    assert max(sent) - min(sent) <= 4 * ROUNDS and min(sent) > 0


def test_a_sender_that_dies_fails_the_receiver_naming_the_group():
    # a hang would end in run_ranks' TimeoutError, not RankFailed: the match is the "no hang"; the
    # failure comes from the ranks' own 3 s transport timeout, collective_timeout_s only guards the rendezvous
    with pytest.raises(RankFailed, match=r"CollectiveError: reshard exchange on cross_pool group \[0, 1\]"):
        run_ranks(silent_sender_rank, 2, timeout_s=300, collective_timeout_s=60)
