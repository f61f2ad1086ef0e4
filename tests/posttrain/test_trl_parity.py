"""Reference parity with TRL (a test-only dependency; it runs on CPU): on the same model, batch and
log-probs, hpcrl's preference losses (DPO sigmoid, IPO, KTO) and SFT's completion-only loss equal TRL's
trainers' within 1e-6.

TRL's own trainers build each batch (tokenisation, <eos>, the completion mask, KTO's mismatched KL rows)
and compute their loss with `compute_loss`; hpcrl's loss functions get the log-probs of the same HF models
on that same batch. A tiny random Llama stands in for the model (the reference = the policy plus noise,
so every log-ratio is non-zero)."""

import copy

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is the reference implementation (a dev dependency)")
datasets = pytest.importorskip("datasets")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from hpcrl.data.tasks import ALPHABET  # noqa: E402
from hpcrl.data.tokenizer import build_char_tokenizer  # noqa: E402
from hpcrl.posttrain.preference_losses import dpo_loss, ipo_loss, kto_losses_B, kto_reference_point  # noqa: E402
from hpcrl.posttrain.sft import sft_loss  # noqa: E402
from hpcrl.train.batch import TrainBatch  # noqa: E402
from hpcrl.train.logprobs import HeadOutputs  # noqa: E402

TOKENIZER = build_char_tokenizer(ALPHABET, 24)
PAIRS = [
    {"prompt": "12=", "chosen": "21", "rejected": "12"},
    {"prompt": "345=", "chosen": "543", "rejected": "5"},
    {"prompt": "7=", "chosen": "7", "rejected": "8830"},
]
COMMON = {"output_dir": "unused", "report_to": [], "use_cpu": True, "per_device_train_batch_size": 6}


def _models() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=24, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    policy = LlamaForCausalLM(config)
    reference = copy.deepcopy(policy)
    with torch.no_grad():  # this reference makes KTO's mismatched log-ratio positive: z0 > 0, not clamped
        for param in reference.parameters():
            param.add_(0.2 * torch.randn_like(param))
    return policy, reference


def _token_logprobs(model, input_ids_BS, attention_BS) -> torch.Tensor:
    """log pi(x_t | x_<t) for t >= 1, [B, S-1] (what every trainer's teacher-forced pass computes)."""
    with torch.no_grad():
        logits = model(input_ids=input_ids_BS, attention_mask=attention_BS).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, input_ids_BS[:, 1:, None]).squeeze(-1)


def _sequence_logprobs(model, batch: dict, prefix: str = "") -> torch.Tensor:
    mask_BS = batch[f"{prefix}completion_mask"][:, 1:]
    logp = _token_logprobs(model, batch[f"{prefix}input_ids"], batch[f"{prefix}attention_mask"])
    return (logp * mask_BS).sum(dim=1)


def _trl_loss(trainer_cls, args, rows: list[dict], **models) -> tuple[float, dict]:
    """TRL's loss on the first batch its own trainer builds from `rows`, and that batch."""
    trainer = trainer_cls(
        args=args, train_dataset=datasets.Dataset.from_list(rows), processing_class=TOKENIZER, **models
    )
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        return trainer.compute_loss(models["model"], batch).item(), batch


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_and_ipo_losses_equal_trl_dpo_trainer(loss_type, tmp_path):
    policy, reference = _models()
    args = trl.DPOConfig(**COMMON, loss_type=[loss_type], beta=0.1, precompute_ref_log_probs=False)
    expected, batch = _trl_loss(trl.DPOTrainer, args, PAIRS, model=policy, ref_model=reference)
    logp_B, ref_B = _sequence_logprobs(policy, batch), _sequence_logprobs(reference, batch)
    chosen, rejected = (
        slice(0, len(PAIRS)),
        slice(len(PAIRS), None),
    )  # TRL's batch: chosen rows, then rejected
    if loss_type == "ipo":
        tokens_B = batch["completion_mask"].sum(dim=1)
        ratio_B = logp_B - ref_B
        ours, _ = ipo_loss(ratio_B[chosen], ratio_B[rejected], tokens_B[chosen], tokens_B[rejected], 0.1)
    else:
        ours, _ = dpo_loss(logp_B[chosen], logp_B[rejected], ref_B[chosen], ref_B[rejected], 0.1)
    assert abs(ours.item() - expected) <= 1e-6 * max(1.0, abs(expected)), (ours.item(), expected)


def test_kto_loss_and_reference_point_equal_trl_kto_trainer():
    policy, reference = _models()
    rows = [
        {"prompt": p["prompt"], "completion": p[key], "label": key == "chosen"}
        for p in PAIRS
        for key in ("chosen", "rejected")
    ]
    args = trl.KTOConfig(
        **COMMON, beta=0.1, desirable_weight=1.0, undesirable_weight=1.25, precompute_ref_log_probs=False,
        train_sampling_strategy="sequential",
    )  # fmt: skip
    expected, batch = _trl_loss(trl.KTOTrainer, args, rows, model=policy, ref_model=reference)
    z0 = kto_reference_point(
        _sequence_logprobs(policy, batch, "KL_"), _sequence_logprobs(reference, batch, "KL_")
    )
    logratio_B = _sequence_logprobs(policy, batch) - _sequence_logprobs(reference, batch)
    ours = kto_losses_B(logratio_B, batch["label"], z0, 0.1, 1.0, 1.25).mean()
    assert float(z0) > 0.1  # the reference point is in play, not clamped away
    assert abs(ours.item() - expected) <= 1e-6 * max(1.0, abs(expected)), (ours.item(), expected)


def test_sft_completion_only_loss_equals_trl_sft_trainer():
    policy, _ = _models()
    rows = [{"prompt": p["prompt"], "completion": p["chosen"]} for p in PAIRS]
    args = trl.SFTConfig(**COMMON, completion_only_loss=True)
    expected, batch = _trl_loss(trl.SFTTrainer, args, rows, model=policy)
    mask_BS = batch["labels"][:, 1:] != -100  # TRL marks the prompt and padding -100
    assert mask_BS.sum() == sum(len(p["chosen"]) + 1 for p in PAIRS)  # the answer and its <eos>
    logp_BS = _token_logprobs(policy, batch["input_ids"], batch["attention_mask"])
    mb = TrainBatch(batch["input_ids"][:, 1:], batch["attention_mask"][:, 1:].bool(), mask_BS)
    mb.num_global_response_tokens, mb.num_global_seqs = int(mask_BS.sum()), len(mask_BS)
    ours, _ = sft_loss(HeadOutputs(logprobs_BT=logp_BS, greedy_BT=torch.zeros_like(logp_BS)), mb)
    assert abs(ours.item() - expected) <= 1e-6 * max(1.0, abs(expected)), (ours.item(), expected)
