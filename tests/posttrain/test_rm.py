"""The reward-model stage: it learns the toy task's preferences, exports an HF `*ForSequenceClassification`
that scores exactly as the trainer did, and that export drives a PPO run; Bradley-Terry parity with TRL."""

import json
from pathlib import Path

import pytest
import torch

from hpcrl.data.preference import load_preference_splits
from hpcrl.data.tasks import get_task, make_splits
from hpcrl.data.tokenizer import model_tokenizer
from hpcrl.metrics.sinks import read_jsonl
from hpcrl.posttrain.preference_losses import bradley_terry_loss
from hpcrl.rewards.config import RewardConfig
from hpcrl.rewards.scoring import build_scorer
from tests.rl._job_ranks import tiny_config

pytestmark = pytest.mark.heavy  # its shared fixtures train or spawn for seconds (launch/test.sh --quick)

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "templates" / "rm_tiny.yaml"
QUIET = {"logging.tensorboard": False, "logging.progress": False}


def _run(template: Path, root: Path, **overrides) -> Path:
    from hpcrl import cli

    args = [f"--{k}={v}" for k, v in {**QUIET, "run_root": str(root), **overrides}.items()]
    assert cli.main(["run", str(template), *args]) == 0
    [metrics] = list(root.glob("*/*/metrics.jsonl"))
    return metrics.parent


@pytest.fixture(scope="module")
def rm_run(tmp_path_factory) -> Path:
    """`hpcrl run templates/rm_tiny.yaml` as a user runs it (800 steps, ~25 s)."""
    return _run(TEMPLATE, tmp_path_factory.mktemp("rm"))


def test_rm_tiny_learns_the_preference_to_095(rm_run):
    rows = read_jsonl(rm_run / "metrics.jsonl")
    held = [(r["step"], r["rm/heldout_accuracy"]) for r in rows if "rm/heldout_accuracy" in r]
    assert [s for s, _ in held] == list(range(0, 801, 100))
    assert held[0][1] < 0.75 and held[-1][1] >= 0.95, held
    assert rows[799]["rm/loss"] < rows[0]["rm/loss"] / 3
    assert (rm_run / "accuracy.png").exists()


def test_rm_export_is_a_sequence_classifier_that_scores_as_the_trainer(rm_run):
    """transformers loads `<run_dir>/hf` as LlamaForSequenceClassification (num_labels 1), and
    `reward.name: model` scores the held-out pairs with the trainer's final accuracy and margin (fp32,
    1e-5): the score is read at the same token, from the same weights."""
    from transformers import AutoModelForSequenceClassification

    config = json.loads((rm_run / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"]
    loaded = AutoModelForSequenceClassification.from_pretrained(rm_run / "hf").config
    assert loaded.num_labels == 1 and loaded.pad_token_id == 0
    cfg = tiny_config(TEMPLATE)
    _, heldout = load_preference_splits(cfg.data, model_tokenizer(None, cfg.model.vocab_size), lengths=True)
    scorer = build_scorer(RewardConfig(name="model", model_path=str(rm_run / "hf")), cfg.data)
    prompts = [p.prompt for p in heldout]
    chosen_N = torch.tensor(scorer(prompts, [p.chosen for p in heldout], [""] * len(heldout)))
    rejected_N = torch.tensor(scorer(prompts, [p.rejected for p in heldout], [""] * len(heldout)))
    final = read_jsonl(rm_run / "metrics.jsonl")[-1]
    loss, stats = bradley_terry_loss(chosen_N, rejected_N)
    assert stats.reward_accuracy == final["rm/heldout_accuracy"]
    assert stats.reward_margin == pytest.approx(final["rm/heldout_margin"], abs=1e-5)
    assert loss.item() == pytest.approx(final["rm/heldout_loss"], abs=1e-5)


def _greedy_task_score(hf_dir: Path, cfg) -> float:
    """Held-out copy-task score of an HF policy's greedy answers (transformers' generate)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    task = get_task(cfg.data.task)
    _, heldout = make_splits(
        task, cfg.data.num_digits, cfg.data.train_size, cfg.data.heldout_size, cfg.data.shuffle_seed
    )
    scores = []
    for example in heldout:
        ids = torch.tensor(
            [[tokenizer.bos_token_id, *tokenizer(example.prompt, add_special_tokens=False).input_ids]]
        )
        out = model.generate(ids, max_new_tokens=cfg.rollout.max_new_tokens, do_sample=False, pad_token_id=0)
        response = tokenizer.decode(
            [t for t in out[0, ids.shape[1] :].tolist() if t != tokenizer.eos_token_id]
        )
        scores.append(task.score(response, example.answer))
    return sum(scores) / len(scores)


def test_ppo_scored_by_the_exported_reward_model_raises_the_task_reward(rm_run, tmp_path):
    """templates/ppo_tiny.yaml with `reward.name: model` at the RM's export: the reward model's held-out
    score rises, and so does the task's own held-out score of the policy (greedy, by the task rule),
    from the initial policy's (the same init, scored by `reward.name: task` at step 0). The run logs that
    task score beside the reward model's (`reward/heldout_task`): at step 0 it is the task-reward run's
    `reward/heldout`, at the end transformers' greedy answers of the export, scored by the rule."""
    ppo = REPO / "templates" / "ppo_tiny.yaml"
    rm = {"reward.name": "model", "reward.model_path": str(rm_run / "hf")}
    run = _run(ppo, tmp_path / "ppo", **rm, **{"algorithm.steps": 60, "algorithm.eval_every": 20})
    evals = [r for r in read_jsonl(run / "metrics.jsonl") if "reward/heldout" in r]
    held = [r["reward/heldout"] for r in evals]
    assert held[-1] > held[0] + 5, held  # the reward model's scores (logits) rise
    assert [r["step"] for r in evals if "reward/heldout_task" in r] == [0, 20, 40, 60]
    start = _run(ppo, tmp_path / "start", **{"algorithm.steps": 1, "algorithm.eval_every": 1})
    start_rows = read_jsonl(start / "metrics.jsonl")
    initial = start_rows[0]["reward/heldout"]
    assert not any("reward/heldout_task" in r for r in start_rows)  # the task reward is the rule already
    assert evals[0]["reward/heldout_task"] == initial
    final = _greedy_task_score(run / "hf", tiny_config(ppo))
    assert evals[-1]["reward/heldout_task"] == pytest.approx(final, abs=1e-6)
    assert final > initial + 0.05, (initial, final)


def test_bradley_terry_loss_equals_trl_reward_trainer():
    """TRL's RewardTrainer on its own batch (chosen rows, then rejected) of a tiny random classifier:
    hpcrl's loss on the same scores equals TRL's within 1e-6."""
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from hpcrl.data.tasks import ALPHABET
    from hpcrl.data.tokenizer import build_char_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=24, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, num_labels=1, pad_token_id=0,
    )  # fmt: skip
    model = LlamaForSequenceClassification(config)
    rows = [
        {"prompt": "12=", "chosen": "12", "rejected": "9"},
        {"prompt": "345=", "chosen": "345", "rejected": "3"},
    ]
    args = trl.RewardConfig(output_dir="unused", report_to=[], use_cpu=True, per_device_train_batch_size=2)
    trainer = trl.RewardTrainer(
        model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
        processing_class=build_char_tokenizer(ALPHABET, 24),
    )  # fmt: skip
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        expected = trainer.compute_loss(model, batch).item()
        scores_B = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0]
    ours, _ = bradley_terry_loss(*scores_B.chunk(2))
    assert abs(ours.item() - expected) <= 1e-6 * max(1.0, abs(expected)), (ours.item(), expected)


def test_expand_refuses_unpaired_rows_for_the_reward_model(tmp_path, capsys):
    """A KTO-style (completion, label) row in the rm stage's data file: exit 2 at expand naming the file,
    the row and `stage`; nothing is written."""
    from hpcrl import cli

    path = tmp_path / "rows.jsonl"
    rows = [
        {"prompt": "1=", "chosen": "1", "rejected": "2"},
        {"prompt": "2=", "completion": "2", "label": True},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    args = ["expand", str(TEMPLATE), "--data.source=jsonl", f"--data.path={path}", f"--run_root={tmp_path}/r"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert (
        str(path) in err
        and "stage" in err
        and "row 1 is unpaired" in err
        and "the rm stage needs pairs" in err
    )
    assert not (tmp_path / "r").exists()


def _rewards(run: Path) -> list[tuple]:
    rows = read_jsonl(run / "metrics.jsonl")
    return [(r["step"], r.get("reward/mean"), r.get("reward/heldout")) for r in rows]


@pytest.mark.slow
def test_the_reward_model_in_megatron_scores_as_transformers_colocated_and_split(rm_run, tmp_path):
    """ppo_tiny scored by the RM's export, 3 steps: reward.model_backend megatron (the RM a frozen
    scalar-head role at the training layout: the training rank, or the split placement's models pool)
    gives every step's reward/mean and held-out reward of the transformers scorer within 1e-5."""
    ppo = REPO / "templates" / "ppo_tiny.yaml"
    base = {
        "reward.name": "model", "reward.model_path": str(rm_run / "hf"), "algorithm.steps": 3,
        "algorithm.eval_every": 2, "checkpoint.save_on_exit": False, "checkpoint.export_hf": False,
        "logging.plot": False,
    }  # fmt: skip
    hf = _rewards(_run(ppo, tmp_path / "hf", **base))
    megatron = _rewards(_run(ppo, tmp_path / "mg", **base, **{"reward.model_backend": "megatron"}))
    split = {"reward.model_backend": "megatron", "placement.kind": "split", "cluster.tasks_per_node": 2}
    on_its_pool = _rewards(_run(ppo, tmp_path / "split", **base, **split))
    assert [s for s, _, _ in hf] == [0, 1, 2, 3] and hf[0][2] is not None
    for other in (megatron, on_its_pool):
        assert [s for s, _, _ in other] == [s for s, _, _ in hf]
        for (_, mean, held), (_, mean_hf, held_hf) in zip(other, hf, strict=True):
            assert (mean is None) == (mean_hf is None) and (held is None) == (held_hf is None)
            assert mean is None or mean == pytest.approx(mean_hf, abs=1e-5)
            assert held is None or held == pytest.approx(held_hf, abs=1e-5)


@pytest.mark.parametrize(
    ("args", "key", "says"),
    [
        (["--reward.model_backend=megatron"], "reward.model_backend", "this reward reads none"),
        (
            ["--reward.name=model", "--reward.model_path={rm}", "--reward.model_backend=megatron",
             "--placement.kind=async", "--cluster.tasks_per_node=2", "--algorithm.tis_cap=2"],
            "reward.model_backend", "scores on its rollout pool",
        ),
        (
            ["--reward.name=model", "--reward.model_path={wide_vocab}", "--reward.model_backend=megatron"],
            "reward.model_path", "the reward model's vocab_size 32 is not the policy's 16",
        ),
    ],
)  # fmt: skip
def test_expand_checks_the_megatron_reward_model(tmp_path, capsys, args, key, says):
    from tests.cli_runs import run_cli

    dirs = {"rm": tmp_path / "rm", "wide_vocab": tmp_path / "wide"}
    for directory, vocab in ((dirs["rm"], 16), (dirs["wide_vocab"], 32)):
        directory.mkdir()
        config = {"model_type": "llama", "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
        (directory / "config.json").write_text(json.dumps(config))
    ppo = REPO / "templates" / "ppo_tiny.yaml"
    argv = [a.format(**dirs) for a in args]
    code, _, err = run_cli(capsys, "expand", ppo, f"--run_root={tmp_path}/runs", *argv)
    assert code == 2 and f"{key}: " in err and says in err, err
    assert not (tmp_path / "runs").exists()
    code, out, err = run_cli(
        capsys, "plan", ppo, "--reward.name=model", f"--reward.model_path={dirs['rm']}",
        "--reward.model_backend=megatron", "--json",
    )  # fmt: skip
    assert code == 0, err
    components = {c["name"]: c["bytes"] for c in json.loads(out)["components"]}
    assert components["reward model params"] == components["critic params"]  # the same trunk and head


@pytest.mark.slow
def test_the_megatron_reward_model_at_its_own_layout(rm_run, tmp_path):
    """ppo_tiny on 2 ranks at d=2; the reward model at t=2 (its own process groups on the same ranks):
    every step's reward/mean and held-out reward equal the transformers scorer's within 1e-5."""
    ppo = REPO / "templates" / "ppo_tiny.yaml"
    base = {
        "reward.name": "model", "reward.model_path": str(rm_run / "hf"), "algorithm.steps": 2,
        "algorithm.eval_every": 2, "checkpoint.save_on_exit": False, "checkpoint.export_hf": False,
        "logging.plot": False, "parallel.data": 2, "cluster.tasks_per_node": 2,
    }  # fmt: skip
    hf = _rewards(_run(ppo, tmp_path / "hf", **base))
    own = {"reward.model_backend": "megatron", "reward.model_tensor": 2}
    megatron = _rewards(_run(ppo, tmp_path / "t2", **base, **own))
    assert [s for s, _, _ in megatron] == [s for s, _, _ in hf] == [0, 1, 2]
    for (_, mean, held), (_, mean_hf, held_hf) in zip(megatron, hf, strict=True):
        assert (mean is None) == (mean_hf is None) and (held is None) == (held_hf is None)
        assert mean is None or mean == pytest.approx(mean_hf, abs=1e-5)
        assert held is None or held == pytest.approx(held_hf, abs=1e-5)
