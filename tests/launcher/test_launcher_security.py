"""No shell path from config values: each reproduced defect of the issue, as a test that failed before.

Profiles come from trusted places only and alone carry `setup`; `cluster.env` names that steer code
are refused; path values and every string that reaches a script are one bounded line; a hostile file
or value is exit 2 with a short message; a dry run shows every script and writes only its sweep dir.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hpcrl import cli
from hpcrl.experiment.resolve import resolve
from hpcrl.launcher.sbatch import sbatch_parameters

REPO = Path(__file__).resolve().parents[2]
CLUSTER = '{executor: slurm, partition: debug, cpus_per_task: 1, env: {OMP_NUM_THREADS: "1"}}'


def template(cluster: str = CLUSTER, name: str = "sec") -> str:
    """A valid one-rank template (the probe entrypoint, a Slurm partition) with this cluster section."""
    return f"name: {name}\nentrypoint: hpcrl.launcher.probe:main\nrun_root: runs\ncluster: {cluster}\n"


BASE = template()
TWO_SHAPES = "sweep: {list: [{}, {cluster.cpus_per_task: 2}]}\n"
POISON = "touch {marker}"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A private cwd, HOME and XDG_CONFIG_HOME: nothing here reads or writes the real ones."""
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def poisoned_profile(path: Path, marker: Path) -> Path:
    return write(path, f"partition: debug\nsetup: [{json.dumps(POISON.format(marker=marker))}]\n")


def listing(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- profiles: trusted places only, never swept, the only source of setup ------------------------------


def test_a_profile_cannot_be_a_sweep_axis(home, capsys):
    marker = home / "X"
    poisoned_profile(home / "evil.yaml", marker)
    t = write(home / "t.yaml", BASE + "sweep: {grid: {cluster.profile: [local-dev, ./evil.yaml]}}\n")
    code, _, err = run_cli(capsys, "submit", t, "--dry-run", "--sweep_dir", home / "sw")
    assert code == 2
    assert f"{t}:sweep.grid.cluster.profile: bad sweep axis: 'cluster.profile' cannot be swept" in err
    listed = write(home / "l.yaml", BASE + "sweep: {list: [{cluster.profile: local-dev}]}\n")
    code, _, err = run_cli(capsys, "expand", listed)
    assert code == 2 and f"{listed}:sweep.list[0].cluster.profile: bad sweep axis" in err
    assert not (home / "sw").exists() and not marker.exists()


def test_a_template_names_a_profile_and_cannot_point_at_a_file(home, capsys):
    marker = home / "X"
    poisoned_profile(home / "evil.yaml", marker)
    poisoned_profile(home / "slurm" / "profiles" / "evil.yaml", marker)  # next to the template: not searched
    for reference, expected in [
        ("evil.yaml", "'evil.yaml' is a file: a template names a profile"),
        ("../evil.yaml", "'../evil.yaml' is a file: a template names a profile"),
        ("slurm/profiles/evil", "'slurm/profiles/evil' is a file: a template names a profile"),
        ("evil", "unknown profile 'evil' (available: a100-ib, local-dev)"),
    ]:
        t = write(home / "t.yaml", template(f"{{profile: {json.dumps(reference)}, partition: debug}}"))
        code, _, err = run_cli(capsys, "submit", t, "--dry-run", "--sweep_dir", home / "sw")
        assert code == 2 and f"{t}:cluster.profile: {expected}" in err, err
    assert not (home / "sw").exists() and not marker.exists()


def test_a_profile_file_is_taken_from_the_command_line_and_the_user_config_dir(home, capsys):
    (home / "mine.yaml").write_text("partition: gpu\nsetup: ['source /opt/site/env.sh']\n")
    t = write(home / "t.yaml", BASE)
    code, out, _ = run_cli(capsys, "expand", t, "--cluster.profile", "mine.yaml", "--json")
    cluster = json.loads(out.splitlines()[0])["config"]["cluster"]
    assert code == 0 and cluster["setup"] == ["source /opt/site/env.sh"]
    assert cluster["profile"] == str(home / "mine.yaml") and cluster["partition"] == "debug"  # template wins
    write(home / "home" / ".config" / "hpcrl" / "profiles" / "site.yaml", "partition: site\nqos: high\n")
    named = write(home / "n.yaml", "entrypoint: hpcrl.launcher.probe:main\ncluster: {profile: site}\n")
    assert resolve(named).elements[0].config.cluster.qos == "high"


def test_setup_lines_come_from_a_profile_only(home, capsys):
    marker = home / "X"
    line = json.dumps(POISON.format(marker=marker))
    base = write(home / "base.yaml", template(f"{{partition: debug, setup: [{line}]}}"))
    t = write(home / "t.yaml", "extends: base.yaml\nseed: 1\n")
    code, _, err = run_cli(capsys, "submit", t, "--dry-run", "--sweep_dir", home / "sw")
    assert code == 2 and f"{base}:cluster.setup: shell setup lines come from a cluster profile only" in err
    plain = write(home / "p.yaml", BASE)
    code, _, err = run_cli(capsys, "submit", plain, "--dry-run", "--cluster.setup", f"[{line}]")
    assert (
        code == 2 and "command line:cluster.setup: shell setup lines come from a cluster profile only" in err
    )
    assert not (home / "sw").exists() and not (home / "runs").exists() and not marker.exists()


# --- cluster.env ----------------------------------------------------------------------------------------

STEERING = [
    "PATH",
    "HOME",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "BASH_ENV",
    "ENV",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONEXECUTABLE",
    "PYTHONINSPECT",
    "PYTHONUSERBASE",
    "PYTHONWARNINGS",
    "IFS",
    "PS4",
    "SHELLOPTS",
    "BASHOPTS",
    "PROMPT_COMMAND",
    "GLIBC_TUNABLES",
    "SLURM_TASK_PROLOG",
    "SRUN_EXPORT_ENV",
    "SUBMITIT_EXECUTOR",
]


def submit_env_names(home, capsys, names):
    """Dry-run submit of a template whose cluster.env sets each name: (template path, exit code, stderr)."""
    t = write(
        home / "t.yaml", template("{partition: debug, env: " + json.dumps(dict.fromkeys(names, "x")) + "}")
    )
    code, _, err = run_cli(capsys, "submit", t, "--dry-run", "--sweep_dir", home / "sw")
    return t, code, err


def test_env_names_that_steer_code_or_are_not_names_are_refused(home, capsys):
    bad = [*STEERING, "path", "Omp_threads", "A-B", "1X", "A B", "BASH_FUNC_srun%%", ""]
    t, code, err = submit_env_names(home, capsys, bad)
    assert code == 2 and not (home / "sw").exists()
    for name in bad:
        assert f"{t}:cluster.env.{name}: " in err, name
    code, _, err = run_cli(
        capsys, "expand", write(home / "ok.yaml", BASE), "--cluster.env", '{PATH: "/tmp/bin"}'
    )
    assert code == 2 and "command line:cluster.env.PATH: may not be set from a config" in err


PASSED_THE_DENYLIST = ["NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "OMPI_MCA_PLM", "PERL5LIB", "NODE_OPTIONS",
                       "OMP_TOOL_LIBRARIES", "TORCH_EXTENSIONS_DIR", "NCCL_DEBUG_FILE", "HF_HOME", "RUBYOPT"]  # fmt: skip
"""Names the denylist let through (2026-12-02), each of which makes some program load or write code or
files; the allowlist refuses them unless the user accepts them in `cluster.env_allow`."""


def test_env_names_are_an_allowlist_not_a_denylist(home, capsys):
    t, code, err = submit_env_names(home, capsys, PASSED_THE_DENYLIST)
    assert code == 2 and not (home / "sw").exists()
    for name in PASSED_THE_DENYLIST:
        assert f"{t}:cluster.env.{name}: {name} is not a known-safe name" in err, name
    assert f"--cluster.env_allow '[{PASSED_THE_DENYLIST[0]}]'" in err  # says how to accept one


def test_env_allow_accepts_names_from_the_command_line_or_a_profile_never_from_a_template(home, capsys):
    env = json.dumps({"HF_HOME": "/scratch/hf", "NCCL_TOPO_FILE": "/etc/nccl.xml"})
    t = write(home / "t.yaml", template("{partition: debug, env: " + env + "}"))
    allow = "[HF_HOME, NCCL_TOPO_FILE]"
    code, out, err = run_cli(
        capsys, "submit", t, "--dry-run", "--sweep_dir", home / "sw", "--cluster.env_allow", allow
    )
    assert code == 0, err
    assert "export HF_HOME=/scratch/hf" in out and "export NCCL_TOPO_FILE=/etc/nccl.xml" in out
    write(home / "p.yaml", f"partition: debug\nenv_allow: {allow}\n")
    assert run_cli(capsys, "expand", t, "--cluster.profile", home / "p.yaml")[0] == 0
    self_allowed = write(
        home / "s.yaml", template("{partition: debug, env_allow: [HF_HOME], env: " + env + "}")
    )
    code, _, err = run_cli(capsys, "expand", self_allowed)
    assert (
        code == 2
        and f"{self_allowed}:cluster.env_allow: environment names are allowed by a cluster profile" in err
    )
    swept = write(home / "w.yaml", BASE + "sweep: {grid: {cluster.env_allow: [[HF_HOME]]}}\n")
    code, _, err = run_cli(capsys, "expand", swept)
    assert code == 2 and "cluster.env_allow' cannot be swept" in err


def test_names_that_steer_code_cannot_be_allowed(home, capsys):
    t = write(home / "t.yaml", template("{partition: debug, env: {LD_PRELOAD: /tmp/x.so}}"))
    code, _, err = run_cli(capsys, "expand", t, "--cluster.env_allow", "[LD_PRELOAD, PATH]")
    assert code == 2 and f"{t}:cluster.env.LD_PRELOAD: LD_* may not be set" in err
    assert "command line:cluster.env_allow: 'PATH': cannot be allowed: may not be set from a config" in err


def test_a_poisoned_path_never_reaches_the_batch_shell(home, capsys):
    """The reproduced defect: `env: {PATH: <dir with a fake srun>}` ran the fake srun."""
    fake = write(home / "bin" / "srun", f"#!/bin/sh\ntouch {home / 'X'}\n")
    fake.chmod(0o755)
    t = write(
        home / "t.yaml",
        template(f"{{partition: debug, env: {{PATH: {json.dumps(str(fake.parent))}}}}}"),
    )
    code, out, _ = run_cli(capsys, "submit", t, "--dry-run", "--sweep_dir", home / "sw")
    assert code == 2 and "export PATH" not in out and not (home / "sw").exists()


def test_tuning_variables_still_reach_the_ranks(home):
    """templates/grpo_tiny.yaml's OMP_NUM_THREADS, a profile's NCCL_*, the harmless PYTHON* knobs."""
    cluster = resolve(REPO / "templates" / "grpo_tiny.yaml").elements[0].config.cluster
    assert "export OMP_NUM_THREADS=1" in sbatch_parameters(cluster, "g")["setup"]
    env = {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "PYTHONHASHSEED": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    t = write(home / "t.yaml", template("{partition: debug, env: " + json.dumps(env) + "}"))
    assert resolve(t).elements[0].config.cluster.env == env


def test_env_exports_come_after_modules_and_profile_setup(home):
    """Nothing the profile runs (module, site scripts) runs under the template's env; the template's
    env wins over what setup exported."""
    (home / "p.yaml").write_text(
        "partition: debug\nmodules: [cuda/12.4]\nsetup: ['export OMP_NUM_THREADS=8']\n"
    )
    t = write(home / "t.yaml", BASE)
    cluster = resolve(t, {"cluster.profile": str(home / "p.yaml")}).elements[0].config.cluster
    assert sbatch_parameters(cluster, "x")["setup"] == [
        "module load cuda/12.4",
        "export OMP_NUM_THREADS=8",
        "export OMP_NUM_THREADS=1",
    ]


# --- paths and lengths ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["--run_root", "runs\n#SBATCH --wrap=touch X"], "command line:run_root"),
        (["--sweep_dir", "sw\ntouch X"], "--sweep_dir"),
        (["--sweep_dir", "sw\rX"], "--sweep_dir"),
        (["--sweep_dir", "sw\x00X"], "--sweep_dir"),
        (["--sweep_dir", "sw\x7fX"], "--sweep_dir"),
        (["--sweep_dir", "sw%jX"], "--sweep_dir"),
        (["--sweep_dir", "s" * 300], "--sweep_dir"),
        (["--data.path", "d\nX"], "command line:data.path"),
        (["--model.hf_path", "m\x00X"], "command line:model.hf_path"),
        (["--checkpoint.dir", "c\x1b[2J"], "command line:checkpoint.dir"),
        (["--cluster.partition", "debug\n#SBATCH --wrap=x"], "command line:cluster.partition"),
        (["--cluster.modules", '["gcc\\ntouch X"]'], "command line:cluster.modules"),
        (["--cluster.modules", "[--force]"], "command line:cluster.modules"),
    ],
)
def test_control_characters_in_paths_and_script_values_are_exit_2_and_create_nothing(home, capsys, argv, key):
    t = write(home / "t.yaml", BASE)
    before = listing(home)
    code, out, err = run_cli(
        capsys, "submit", t, "--dry-run", *(["--sweep_dir", "sw"] if argv[0] != "--sweep_dir" else []), *argv
    )
    assert code == 2, out
    assert f"{key}: " in err and "Traceback" not in err
    assert listing(home) == before


def test_a_huge_name_is_exit_2_with_a_short_message(home, capsys):
    """Was an uncaught OSError (File name too long) from mkdir."""
    t = write(home / "t.yaml", template(name="n" * 100_000))
    code, _, err = run_cli(capsys, "submit", t, "--dry-run")
    assert code == 2 and f"{t}:name: 'nnnn" in err and "100,000 characters long" in err
    assert len(err) < 2000 and not (home / "runs").exists()


def test_an_unwritable_run_root_is_exit_2_naming_it(home, capsys):
    (home / "file").write_text("")
    t = write(home / "t.yaml", BASE)
    code, _, err = run_cli(capsys, "submit", t, "--dry-run", "--run_root", home / "file" / "runs")
    assert code == 2 and f"run_root: lies under '{home / 'file'}', a file" in err and "Traceback" not in err


@pytest.mark.timeout(60)  # expanding 10^9 nodes could never finish in time: the guard is the "before"
def test_a_billion_laughs_sweep_axis_is_exit_2_before_expanding_and_short(home, capsys):
    """Was exit 2 after printing 312 MB of error text."""
    levels = ['  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        levels.append(f"  a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]")
    t = write(home / "t.yaml", BASE + "laughs:\n" + "\n".join(levels) + "\nsweep:\n  grid:\n    seed: *a8\n")
    code, _, err = run_cli(capsys, "submit", t, "--dry-run", "--sweep_dir", home / "sw")
    assert code == 2
    assert f"{t}: YAML aliases expand to more than 1,000,000 nodes" in err and len(err) < 1000


@pytest.mark.timeout(60)  # the count is refused before 216,000 configs are built and printed
def test_a_sweep_that_multiplies_past_the_limit_is_exit_2_before_expanding(home, capsys):
    axes = ", ".join(
        f"{k}: {list(range(1, 61))}" for k in ("seed", "algorithm.steps", "optim.micro_batch_size")
    )
    t = write(home / "t.yaml", BASE + f"sweep: {{grid: {{{axes}}}}}\n")
    code, _, err = run_cli(capsys, "expand", t)
    assert code == 2 and f"{t}:sweep: 216,000 elements; a sweep has at most 100,000" in err


# --- the dry run ----------------------------------------------------------------------------------------


def test_the_dry_run_prints_every_script_and_writes_only_its_sweep_dir(home, capsys):
    t = write(home / "t.yaml", BASE + TWO_SHAPES)
    before = listing(home)
    code, out, _ = run_cli(capsys, "submit", t, "--dry-run", "--sweep_dir", home / "sw")
    assert code == 0
    scripts = sorted((home / "sw" / "sbatch").glob("*.sh"))
    assert [p.name for p in scripts] == ["array-0.sh", "array-1.sh"]
    for script in scripts:
        assert f"# {script} (indices" in out and script.read_text() in out
        assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    assert "#SBATCH --cpus-per-task=1" in out and "#SBATCH --cpus-per-task=2" in out
    new = listing(home) - before
    assert new and all(p == home / "sw" or (home / "sw") in p.parents for p in new), sorted(new)
    manifest = json.loads((home / "sw" / "manifest.json").read_text())
    assert all(Path(e["config_path"]).is_file() for e in manifest["entries"])


def test_expand_shows_values_as_text_not_rich_markup(home, capsys):
    t = write(home / "t.yaml", BASE + 'sweep: {grid: {data.task: ["[/]", "[bold]x"]}}\n')
    code, out, _ = run_cli(capsys, "expand", t)
    assert code == 0 and "[/]" in out and "[bold]x" in out


def test_problems_are_printed_bounded_and_on_one_line_each(home, capsys):
    bad = {f"K{i}-": "v" for i in range(80)}
    task = json.dumps("x\x1b]0;owned\x07")  # ESC ] ... BEL: sets the terminal's title
    t = write(
        home / "t.yaml",
        template("{partition: debug, env: " + json.dumps(bad) + "}") + f"data: {{task: {task}}}\n",
    )
    code, _, err = run_cli(capsys, "expand", t)
    assert code == 2 and "hpcrl: 81 problem(s):" in err and "... and 31 more" in err
    assert "\x1b" not in err and all(line.isprintable() for line in err.splitlines())
    assert os.environ.get("PATH")  # the test changed nothing of its own process's environment


def test_resume_checks_the_configs_it_submits_again(home, capsys):
    """A config.yaml edited after the submit (here: PATH added to its env) is refused, not resubmitted:
    its content no longer has the manifest's fingerprint. The same value as a resume override is
    refused by the env rule, as a submit refuses it."""
    t = write(home / "t.yaml", BASE)
    assert run_cli(capsys, "submit", t, "--dry-run", "--sweep_dir", home / "sw")[0] == 0
    manifest_path = home / "sw" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for entry in manifest["entries"]:
        entry["state"] = "SUBMIT_FAILED"
    manifest_path.write_text(json.dumps(manifest))
    before = json.loads(manifest_path.read_text())
    code, _, err = run_cli(capsys, "resume", home / "sw", "--cluster.env", "{PATH: /tmp/bin}")
    assert code == 2 and "command line:cluster.env.PATH: may not be set" in err
    config = Path(manifest["entries"][0]["config_path"])
    config.write_text(config.read_text().replace('OMP_NUM_THREADS: "1"', "PATH: /tmp/bin"))
    code, _, err = run_cli(capsys, "resume", home / "sw")
    assert code == 2 and f"{config}:run_root: holds config " in err and "the manifest's fingerprint" in err
    assert json.loads(manifest_path.read_text()) == before  # nothing resubmitted, nothing recorded


def test_template_and_extends_paths_follow_the_path_rule(home, capsys):
    write(home / "base.yaml", BASE)
    t = write(home / "t.yaml", 'extends: "base\\u001b[2J.yaml"\n')
    code, _, err = run_cli(capsys, "expand", t)
    assert code == 2 and f"{t}:extends: " in err and "contains the non-printable character '\\x1b'" in err
    odd = write(home / "t\x1b]0;x\x07.yaml", BASE)
    code, _, err = run_cli(capsys, "expand", odd)
    assert code == 2 and "TEMPLATE: " in err and "\x1b" not in err
