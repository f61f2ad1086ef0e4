import pytest
import torch

from hpcrl.train.batch import TrainBatch
from tests.train._rank_fns import tiny_batch, tiny_config


def test_micro_batches_slice_every_field_and_keep_global_counts():
    batch = tiny_batch(tiny_config())
    batch.num_global_seqs, batch.num_global_response_tokens = 8, 30
    parts = batch.micro_batches(3)
    assert [len(p) for p in parts] == [3, 1]
    assert torch.equal(torch.cat([p.extras["advantages_BT"] for p in parts]), batch.extras["advantages_BT"])
    assert parts[1].num_global_response_tokens == 30
    # response tokens per row: 3, 4, 5, 3 -> 15 in this DP rank's batch, of 30 globally
    assert sum(float(p.token_mean(torch.ones(len(p), 8))) for p in parts) == pytest.approx(15 / 30)


def test_bad_batches_are_rejected_naming_the_field():
    ids = torch.zeros(2, 4, dtype=torch.long)
    ones = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="response_mask_BT has shape"):
        TrainBatch(input_ids_BT=ids, attention_mask_BT=ones, response_mask_BT=ones[:, :3])
    with pytest.raises(ValueError, match=r"extras\['returns_BT'\]"):
        TrainBatch(
            input_ids_BT=ids,
            attention_mask_BT=ones,
            response_mask_BT=ones,
            extras={"returns_BT": torch.zeros(3, 4)},
        )
    packed = torch.tensor([[0, 1, 0, 1], [0, 1, 2, 3]])
    with pytest.raises(ValueError, match="one sequence per row: the trainer packs rows itself"):
        TrainBatch(input_ids_BT=ids, attention_mask_BT=ones, response_mask_BT=ones, position_ids_BT=packed)
    with pytest.raises(ValueError, match="not set"):
        TrainBatch(input_ids_BT=ids, attention_mask_BT=ones, response_mask_BT=ones).token_mean(ones.float())
