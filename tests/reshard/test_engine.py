"""Both reshard engines on real gloo groups: bitwise shards, exact volumes, zero redundancy, restore."""

import pytest

from hpcrl.distributed.layout import ParallelLayout
from hpcrl.distributed.spawn import RankFailed, run_ranks
from hpcrl.reshard.params import split_bytes_per_rank
from tests.reshard._rank_fns import dims_metas, dying_rank, model_dims, reshard_pairs_rank

pytestmark = pytest.mark.dist

BUCKET = 2048  # bytes: small enough that every stream spans several buckets


def valid_pairs(max_world: int, min_world: int = 2) -> list[tuple[int, int, int, int, int]]:
    sizes = (1, 2, 4, 8)
    return [
        (t, p, d, t_g, p_g)
        for t in sizes
        for p in sizes
        for d in sizes
        if min_world <= t * p * d <= max_world
        for t_g in sizes
        if t % t_g == 0
        for p_g in sizes
        if p % p_g == 0
    ]


def _check(results: list, pairs: list, **dims_overrides) -> None:
    dims = model_dims(**dims_overrides)
    for i, (t, p, d, t_g, p_g) in enumerate(pairs):
        layout = ParallelLayout(tensor=t, pipeline=p, data=d, rollout_tensor=t_g, rollout_pipeline=p_g)
        per_rank = split_bytes_per_rank(dims_metas(dims, p), t, p)
        for rank in range(layout.world_size):
            res = results[rank][i]
            where = f"{layout.describe()} rank {rank}"
            for kind in ("hybrid", "naive"):
                r = res[kind]
                assert r["names"] == res["expected_names"], where
                assert r["wrong"] == [], (
                    f"{where} {kind}: shards differ from the full model's slice {r['wrong']}"
                )
                assert r["restored"] and r["same_memory"], f"{where} {kind}: training shards touched"
                assert r["live_after"] == 0, f"{where} {kind}: generation buffers not released"
            hybrid, naive = res["hybrid"], res["naive"]
            # exact volume: the lower bound, = (d_g-1)/(tp)·M_split when stages are balanced
            assert hybrid["split"]["bytes_received"] == res["lower_bound_split"], where
            assert (
                hybrid["split"]["bytes_received"] + hybrid["replicated"]["bytes_received"]
                == res["lower_bound"]
            )
            if per_rank is not None:
                assert hybrid["split"]["bytes_received"] == (layout.micro_data - 1) * per_rank, where
                assert naive["split"]["bytes_received"] == (t * p - 1) * per_rank, where
            # zero redundancy: own shard in place; extra = received part (+ one staging bucket at most)
            assert hybrid["in_place"], where
            assert hybrid["received_buffers"] == res["lower_bound"], where
            assert res["lower_bound"] <= hybrid["peak"] <= res["lower_bound"] + BUCKET, where
            # each dtype stream meets its own bound (no element converted on the way)
            assert hybrid["per_stream"] == res["stream_bounds"], where


def test_bitwise_volume_and_memory_on_four_ranks():
    """Issue pairs t=4 -> t_g=2 and p=2 -> p_g=1, plus TP+PP merge, a DP copy, PP merge 4 -> 2: one spawn."""
    pairs = [(4, 1, 1, 2, 1), (1, 2, 1, 1, 1), (2, 2, 1, 1, 1), (2, 1, 2, 1, 1), (1, 4, 1, 1, 2)]
    _check(run_ranks(reshard_pairs_rank, 4, pairs, BUCKET), pairs)


def test_mixed_precision_model_moves_as_one_stream_per_dtype_each_at_its_bound():
    """bf16 matrices (and q/k/v bias) beside fp32 norms (megatron's local spec builds its norms so; an MoE
    router may stay fp32 too): two streams, every generation tensor bitwise in its own dtype, bytes =
    bound per stream."""
    pairs = [(4, 1, 1, 2, 1), (2, 2, 1, 1, 1), (1, 4, 1, 1, 2)]
    mixed = {"dtype": "bfloat16", "norm_dtype": "float32"}
    results = run_ranks(reshard_pairs_rank, 4, pairs, BUCKET, "cpu", mixed)
    _check(results, pairs, **mixed)
    assert results[0][0]["streams"] == ["split.bfloat16", "replicated.float32"]


@pytest.mark.heavy
@pytest.mark.slow
def test_bitwise_volume_and_memory_for_every_valid_pair_up_to_8_ranks():
    """All 55 valid pairs with 2 <= world <= 8 (incl. t=4,p=2 -> t_g=2,p_g=1 and t=2,p=2,d=2 -> 1,1)."""
    pairs = valid_pairs(8)
    assert (4, 2, 1, 2, 1) in pairs and (2, 2, 2, 1, 1) in pairs and len(pairs) == 55
    results = run_ranks(reshard_pairs_rank, 8, pairs, BUCKET, timeout_s=600)
    _check(results, pairs)
    # t=4,p=2 -> t_g=2,p_g=1: 3/8·M vs 7/8·M (HybridFlow Table 2)
    r0 = results[0][pairs.index((4, 2, 1, 2, 1))]
    assert r0["naive"]["split"]["bytes_received"] * 3 == r0["hybrid"]["split"]["bytes_received"] * 7


@pytest.mark.heavy
@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_a_rank_that_dies_or_hangs_mid_reshard_fails_its_peers_naming_the_group(mode):
    # a hang would end in run_ranks' TimeoutError, not RankFailed: the match is the "no hang"; the
    # failure comes from the ranks' own 3 s transport timeout, collective_timeout_s only guards the rendezvous
    with pytest.raises(RankFailed, match=r"CollectiveError: reshard all_gather on micro_data group \[0, 1\]"):
        run_ranks(dying_rank, 2, mode, timeout_s=300, collective_timeout_s=60)


@pytest.mark.gpu
def test_nccl_cuda_path_is_the_same_code():
    """Same rank function on CUDA tensors over NCCL: one rank per GPU."""
    import torch

    gpus = torch.cuda.device_count()
    if gpus < 2:
        pytest.skip(f"needs 2 GPUs for an NCCL group (one rank per GPU), found {gpus}")
    pairs = valid_pairs(min(gpus, 8))
    results = run_ranks(
        reshard_pairs_rank, min(gpus, 8), pairs, BUCKET, "cuda", backend="nccl", timeout_s=600
    )
    _check(results, pairs)
