"""On-policy distillation (algorithm.name: distill): the advantage's formula, the teacher's rules at
expand, and learning: a random-init student distilled from sft_tiny's export on the copy task reaches
>= 0.9 of the teacher's held-out score without a reward, through `hpcrl run`, on 3 seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hpcrl import cli
from hpcrl.metrics.sinks import read_jsonl
from hpcrl.rl.advantages import AdvantageInputs, compute_advantages, masked_whiten, reverse_kl_advantages
from tests.cli_runs import run_cli

pytestmark = pytest.mark.heavy  # its shared fixtures train or spawn for seconds (launch/test.sh --quick)

REPO = Path(__file__).resolve().parents[2]
DISTILL = REPO / "templates" / "distill_tiny.yaml"
QUIET = ["--logging.tensorboard=false", "--logging.progress=false", "--logging.plot=false"]


def test_reverse_kl_advantage_is_the_teacher_minus_the_student_log_prob_per_token():
    """A_t = log pi_T - log pi_S + c * r on every response token, 0 on padding; zero when they agree."""
    student_BT = torch.tensor([[-0.5, -2.0, -1.0], [-0.1, -0.2, -9.0]])
    teacher_BT = torch.tensor([[-0.1, -3.0, -1.0], [-0.1, -0.7, -1.0]])
    mask_BT = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    scores_B = torch.tensor([1.0, 0.0])
    got = reverse_kl_advantages(student_BT, teacher_BT, scores_B, mask_BT, task_coef=0.5)
    expected = torch.tensor([[0.4 + 0.5, -1.0 + 0.5, 0.0 + 0.5], [0.0, -0.5, 0.0]])
    torch.testing.assert_close(got, expected)
    same = reverse_kl_advantages(student_BT, student_BT, scores_B, mask_BT, task_coef=0.0)
    assert torch.equal(same, torch.zeros_like(same))
    inputs = dict(scores_B=scores_B, token_rewards_BT=torch.zeros_like(mask_BT), mask_BT=mask_BT,
                  group_ids_B=torch.tensor([0, 1]), logprobs_BT=student_BT, teacher_logprobs_BT=teacher_BT,
                  task_coef=0.5)  # fmt: skip
    raw = compute_advantages("distill", AdvantageInputs(**inputs, distill_whiten=False)).advantages_BT
    torch.testing.assert_close(raw, expected)
    whitened = compute_advantages("distill", AdvantageInputs(**inputs)).advantages_BT
    torch.testing.assert_close(whitened, masked_whiten(expected, mask_BT))
    assert whitened[1, 2] == 0 and abs(float(whitened[mask_BT.bool()].mean())) < 1e-6


def _teacher_dir(tmp_path: Path, **config) -> Path:
    """An HF directory holding only a config.json (what expand reads of a teacher)."""
    directory = tmp_path / "teacher"
    directory.mkdir(parents=True, exist_ok=True)
    base = {"model_type": "llama", "vocab_size": 16, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
    (directory / "config.json").write_text(json.dumps(base | config))
    return directory


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "algorithm.teacher_path: distill needs a teacher"),
        (["--algorithm.name=grpo", "--algorithm.teacher_path={teacher}"], "only algorithm.name: distill reads"),
        (["--algorithm.name=grpo", "--algorithm.distill_task_coef=1"], "only algorithm.name: distill reads it"),
        (["--algorithm.teacher_path={teacher}", "--algorithm.distill_task_coef=-1"], "must be >= 0, got -1.0"),
        (["--algorithm.teacher_path={teacher}", "--algorithm.distill_task_coef=.inf"], "must be a finite number >= 0"),
        (["--algorithm.teacher_path={other_vocab}"], "the teacher's vocab_size 32 is not the policy's 16"),
        (["--algorithm.teacher_path={odd_heads}", "--parallel.tensor=2", "--cluster.tasks_per_node=2"],
         "the teacher's model.num_attention_heads: rule heads % t == 0"),
        (["--algorithm.teacher_path={broken}"], "config.json: not valid JSON"),
    ],
)  # fmt: skip
def test_expand_checks_the_teacher_naming_the_key(tmp_path, capsys, args, says):
    """Each is exit 2 at expand naming `algorithm.*` (the teacher's config.json read where it is here),
    and nothing is written under the run root."""
    dirs = {
        "teacher": _teacher_dir(tmp_path / "a"),
        "other_vocab": _teacher_dir(tmp_path / "b", vocab_size=32),
        "odd_heads": _teacher_dir(
            tmp_path / "c", num_attention_heads=3, num_key_value_heads=1, hidden_size=63
        ),
        "broken": tmp_path / "d",
    }
    dirs["broken"].mkdir()
    (dirs["broken"] / "config.json").write_bytes(b'{"vocab_size": 16,\x00')
    argv = [a.format(**dirs) for a in args]
    code, _, err = run_cli(capsys, "expand", DISTILL, f"--run_root={tmp_path}/runs", *argv)
    assert code == 2 and says in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("hostile", ["a\nb", "e\x1b[31m", "t\x00x", "x" * 2000, f"{'y' * 300}/hf", ""])
def test_a_hostile_teacher_path_is_exit_2_naming_the_key(tmp_path, capsys, hostile):
    code, _, err = run_cli(
        capsys, "expand", DISTILL, f"--run_root={tmp_path}/runs", "--algorithm.teacher_path", hostile
    )
    assert code == 2 and "algorithm.teacher_path" in err, err
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def teacher(sft_copy_export) -> Path:
    """sft_tiny's export on the copy task (the session's shared SFT policy, tests/conftest.py)."""
    return sft_copy_export


def _heldout(root: Path) -> list[tuple[int, float]]:
    [metrics] = list(root.glob("*/*/metrics.jsonl"))
    return [(r["step"], r["reward/heldout"]) for r in read_jsonl(metrics) if "reward/heldout" in r]


@pytest.fixture(scope="module")
def teacher_score(teacher, tmp_path_factory) -> float:
    """The teacher's own held-out score: the same greedy eval with the teacher as the policy
    (model.hf_path), its step-0 evaluation. The same for every seed, so measured once."""
    own = tmp_path_factory.mktemp("teacher_score")
    argv = ["run", DISTILL, f"--run_root={own}", f"--model.hf_path={teacher}", "--algorithm.steps=1"]
    assert cli.main([str(a) for a in [*argv, f"--algorithm.teacher_path={teacher}", *QUIET]]) == 0
    score = _heldout(own)[0][1]
    assert score >= 0.95, score
    return score


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_student_reaches_09_of_the_teachers_heldout_score(teacher, teacher_score, tmp_path, capsys, seed):
    """distill_tiny as its header says to run it: the teacher's own held-out score (`teacher_score`)
    against the student's, from random init (its own per seed), 150 steps."""
    student = tmp_path / "student"
    argv = ["run", DISTILL, f"--run_root={student}", f"--algorithm.teacher_path={teacher}", *QUIET]
    argv += [f"--seed={seed}", f"--model.init_seed={7 + seed}"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    held = _heldout(student)
    assert held[0][1] < 0.2 and held[-1][1] >= 0.9 * teacher_score, (teacher_score, held)
    [metrics] = list(student.glob("*/*/metrics.jsonl"))
    kl = [r["distill/reverse_kl"] for r in read_jsonl(metrics) if "distill/reverse_kl" in r]
    assert sum(kl[-20:]) / 20 < sum(kl[:20]) / 20 / 3, (kl[:3], kl[-3:])  # the KL to the teacher falls
    assert (student / "distill_tiny").exists()


def test_plan_counts_the_teacher_on_the_models_pool(tmp_path, capsys):
    """`hpcrl plan`: the teacher's params in the student's dtype, sized from its own config.json (here
    twice the student's width), on the split placement's models pool; a teacher whose config.json is not
    here is exit 2 naming algorithm.teacher_path (there are no template fields to plan it from)."""
    wide = _teacher_dir(tmp_path, hidden_size=128, intermediate_size=256)
    split = ["--placement.kind=split", "--cluster.tasks_per_node=2"]
    code, out, err = run_cli(capsys, "plan", DISTILL, f"--algorithm.teacher_path={wide}", "--json", *split)
    assert code == 0, err
    components = {c["name"]: c for c in json.loads(out)["components"]}
    # the tiny llama at width 128: embedding + output 2·16·128, 2 layers of q,k,v,o (128·(128+64+64+128))
    # + SwiGLU 3·128·256 + 2 norms, final norm
    layer = 128 * (128 + 32 * 2 * 2 + 128) + 3 * 128 * 256 + 2 * 128
    assert components["teacher params"]["bytes"] == 4 * (2 * 16 * 128 + 2 * layer + 128)
    code, _, err = run_cli(capsys, "plan", DISTILL, f"--algorithm.teacher_path={tmp_path}/absent")
    assert code == 2 and "algorithm.teacher_path" in err and "the teacher" in err, err


def test_the_ranks_refuse_a_frozen_model_of_another_vocabulary():
    """The ranks' own check (a teacher path that exists only on the cluster passes expand unread): a
    frozen model whose vocabulary is not the policy's is a ConfigError naming its key and directory."""
    from types import SimpleNamespace

    from hpcrl.errors import ConfigError
    from hpcrl.experiment.config import ExperimentConfig
    from hpcrl.rl.roles import _same_vocabulary

    cfg = ExperimentConfig()  # the tiny model: vocab_size 32
    same = SimpleNamespace(model_cfg=SimpleNamespace(vocab_size=32, hf_path="/cluster/teacher"))
    assert _same_vocabulary(same, cfg, "algorithm.teacher_path", "teacher") is same
    other = SimpleNamespace(model_cfg=SimpleNamespace(vocab_size=48, hf_path="/cluster/teacher"))
    with pytest.raises(ConfigError, match="the teacher's vocab_size 48 is not the policy's 32") as err:
        _same_vocabulary(other, cfg, "algorithm.teacher_path", "teacher")
    assert err.value.problems[0].key == "algorithm.teacher_path"
    assert err.value.problems[0].file == "/cluster/teacher"


def _distill_rows(teacher: Path, root: Path, capsys, *extra: str) -> list[dict]:
    argv = ["run", DISTILL, f"--run_root={root}", f"--algorithm.teacher_path={teacher}", *QUIET]
    argv += [
        "--algorithm.steps=3",
        "--algorithm.eval_every=0",
        "--checkpoint.save_on_exit=false",
        "--checkpoint.export_hf=false",
    ]
    code, _, err = run_cli(capsys, *argv, "--cluster.tasks_per_node=2", *extra)
    assert code == 0, err
    [metrics] = list(root.glob("*/*/metrics.jsonl"))
    return [r for r in read_jsonl(metrics) if "distill/reverse_kl" in r]


@pytest.mark.slow
def test_the_teacher_at_a_layout_of_its_own_scores_as_at_the_policys(teacher, tmp_path, capsys):
    """The policy at t=2 on 2 ranks; the teacher at the policy's layout, at t=1 (d=2 replicas) and at p=2
    (its own process groups on the same ranks): every step's reverse KL and the policy's update agree
    within 1e-5."""
    policy = ["--parallel.tensor=2"]
    same = _distill_rows(teacher, tmp_path / "same", capsys, *policy)
    replicas = _distill_rows(teacher, tmp_path / "t1", capsys, *policy, "--algorithm.teacher_tensor=1")
    stages = _distill_rows(
        teacher,
        tmp_path / "p2",
        capsys,
        *policy,
        "--algorithm.teacher_tensor=1",
        "--algorithm.teacher_pipeline=2",
    )
    assert len(same) == 3
    for other in (replicas, stages):
        for a, b in zip(same, other, strict=True):
            for key in ("distill/reverse_kl", "actor/grad_norm", "reward/mean"):
                assert b[key] == pytest.approx(a[key], abs=1e-5), (key, a[key], b[key])


@pytest.mark.parametrize(
    ("args", "key", "says"),
    [
        (["--algorithm.teacher_tensor=3"], "algorithm.teacher_tensor", "does not divide the 2 ranks"),
        (["--algorithm.teacher_tensor=0"], "algorithm.teacher_tensor", "must be in [1, 2^20], got 0"),
        (["--algorithm.teacher_pipeline=-1"], "algorithm.teacher_pipeline", "must be in [1, 2^20], got -1"),
        (["--algorithm.name=grpo", "--algorithm.teacher_path=null", "--algorithm.teacher_tensor=1"],
         "algorithm.teacher_tensor", "only algorithm.name: distill reads it"),
        (["--reward.model_tensor=2"], "reward.model_tensor", "only reward.model_backend: megatron reads it"),
        (["--algorithm.teacher_tensor=2", "--algorithm.teacher_path={odd}"], "algorithm.teacher_path",
         "the teacher's model.num_query_groups: rule kv_heads % t == 0"),
    ],
)  # fmt: skip
def test_expand_checks_a_frozen_models_own_layout(tmp_path, capsys, args, key, says):
    """On 2 ranks (t=1, d=2): each is exit 2 naming the key, nothing written."""
    dirs = {
        "teacher": _teacher_dir(tmp_path / "a"),
        "odd": _teacher_dir(tmp_path / "b", num_key_value_heads=1),
    }
    argv = [a.format(**dirs) for a in ["--algorithm.teacher_path={teacher}", *args]]
    two = ["--parallel.data=2", "--cluster.tasks_per_node=2"]
    code, _, err = run_cli(capsys, "expand", DISTILL, f"--run_root={tmp_path}/runs", *two, *argv)
    assert code == 2 and f"{key}: " in err and says in err, err
    assert not (tmp_path / "runs").exists()


def test_plan_sizes_the_teacher_at_its_own_layout(tmp_path, capsys):
    """The policy at t=2; the teacher at t=2 holds its TP shard, at t=1 all of it."""
    teacher_dir = _teacher_dir(tmp_path)
    sizes = {}
    for t in (1, 2):
        code, out, err = run_cli(
            capsys, "plan", DISTILL, f"--algorithm.teacher_path={teacher_dir}", "--parallel.tensor=2",
            "--cluster.tasks_per_node=2", f"--algorithm.teacher_tensor={t}", "--json",
        )  # fmt: skip
        assert code == 0, err
        [teacher] = [c for c in json.loads(out)["components"] if c["name"] == "teacher params"]
        assert f"at t={t}, p=1" in teacher["formula"]
        sizes[t] = teacher["bytes"]
    assert sizes[2] < sizes[1] < 2 * sizes[2] + 1  # embedding, layers and LM head split; norms replicated
