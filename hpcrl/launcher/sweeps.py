"""Sweep operations behind the CLI: prepare (write configs + manifest), submit, status, cancel, resume.

Order of a submit: resolve + check everything (nothing is written on a config error) -> write each
element's resolved config into its run dir -> write the manifest (state NEW) -> submit the arrays ->
rewrite the manifest with job ids. Every manifest write is atomic; a failed sbatch marks the elements
it covered SUBMIT_FAILED (so `resume` can retry them) and is reported as a ClusterError (exit 1).
A directory that cannot be created or written is a ConfigError naming it (exit 2), never a traceback.

A dry run writes inside the sweep directory only: the configs go to <sweep>/configs/<id>.yaml (one
file each, no directory: a 100,000-element dry run is mostly file system calls, and a directory and a
rename per file tripled their cost), the manifest still names each element's future run directory; the
scripts go to <sweep>/sbatch/.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from hpcrl.config.output_dirs import RUN_ROOT, SWEEP_DIR, DirKind, output_dir_problem
from hpcrl.config.safe_read import read_capped
from hpcrl.config.schema import build, check_tree, deep_merge, get_dotted, to_dict, with_values
from hpcrl.config.yaml_io import MAX_YAML_BYTES, load_yaml
from hpcrl.errors import ClusterError, ConfigError, Problem, cut
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.ids import config_id
from hpcrl.experiment.resolve import ResolvedConfig, Sweep, user_code_specs
from hpcrl.experiment.stage_kinds import section_problems, stage_data
from hpcrl.launcher import local, preflight, slurm
from hpcrl.launcher.element import read_launcher_state
from hpcrl.launcher.sweep_manifest import (
    CONFIG_FILE,
    DRY_RUN_CONFIGS,
    FINAL,
    MANIFEST,
    RESUBMITTABLE,
    SLURM_STATES,
    Entry,
    Manifest,
    load_manifest,
)
from hpcrl.progress import Track, untracked
from hpcrl.usercode.spec import source_sha256

SLURM_DIR = "slurm"
SBATCH_DIR = "sbatch"


def sweep_dir_problems(sweep_dir: Path, key: str, kind: DirKind = SWEEP_DIR) -> list[Problem]:
    """The sweep directory (given as --sweep_dir, or made of run_root and name) is an output directory
    of `kind` (hpcrl.config.output_dirs: no symlink on the way, not someone else's non-empty folder), and it
    holds no '%': submitit writes it into #SBATCH --output/--error, where Slurm reads %<letter> as a
    pattern (the logs would go to another directory)."""
    text = str(sweep_dir)
    problem = output_dir_problem(sweep_dir, kind) or (
        "has a '%', which Slurm reads as a file name pattern" if "%" in text else None
    )
    return [Problem(problem, key=key)] if problem else []


def run_roots(sweep: Sweep) -> set[str]:
    """The run roots of a sweep's run directories: the first element's unless run_root is swept."""
    if "run_root" in sweep.keys:
        return {element.config.run_root for element in sweep.elements}
    return {sweep.elements[0].config.run_root}


def run_root_problems(roots: Iterable[str]) -> list[Problem]:
    """Each run root is an output directory (hpcrl.config.output_dirs: no symlink on the way, and a
    non-empty one holds only directories, one per experiment name)."""
    problems = []
    for root in sorted(roots):
        problem = output_dir_problem(root, RUN_ROOT)
        if problem:
            problems.append(Problem(problem, file=str(Path(root).absolute()), key="run_root"))
    return problems


def existing_sweep_problems(sweep_dir: Path, key: str, force: bool) -> list[Problem]:
    """A second submit into a sweep directory used to replace its manifest silently, and the first
    sweep's jobs were tracked no more. A directory holding a submitted sweep is refused unless `force`;
    a dry run's may be reused (nothing runs from it)."""
    if force or not (sweep_dir / MANIFEST).exists():
        return []
    try:
        manifest = load_manifest(sweep_dir)
    except ConfigError:
        return [
            Problem(f"{sweep_dir} holds a manifest.json that does not load; --force replaces it", key=key)
        ]
    if all(e.state == "DRY_RUN" for e in manifest.entries):
        return []
    return [
        Problem(
            f"{sweep_dir} holds a submitted sweep ({len(manifest.entries)} element(s)), which `hpcrl status` "
            "and `hpcrl resume` track: choose another --sweep_dir, or --force to replace its manifest",
            key=key,
        )
    ]


@contextlib.contextmanager
def writing(sweep_dir: Path | None, key: str) -> Iterator[None]:
    """Turn a file system refusal (permission, read-only, a name too long) into a ConfigError naming the
    path and the option that chose it (exit 2) instead of a traceback: `key` for a path inside
    `sweep_dir` (the option that chose the sweep directory), run_root for a run directory."""
    try:
        yield
    except OSError as err:
        path = Path(os.fsdecode(err.filename)) if err.filename is not None else None
        inside = (
            sweep_dir is not None
            and path is not None
            and (
                path.is_relative_to(sweep_dir) or sweep_dir.is_relative_to(path)  # in it, or on the way to it
            )
        )
        message = f"cannot create or write a file or directory here: {err.strerror or err}"
        raise ConfigError(
            Problem(message, file=None if path is None else str(path), key=key if inside else "run_root")
        ) from None


def slurm_folder(manifest: Manifest) -> Path:
    """The sweep's submitit folder: scripts, pickles, logs and result files of its array jobs."""
    return Path(manifest.sweep_dir) / SLURM_DIR


def default_sweep_dir(sweep: Sweep) -> Path:
    first = sweep.elements[0].config
    digest = hashlib.sha256("".join(sweep.elements.ids).encode()).hexdigest()[:6]
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return (Path(first.run_root) / sweep.name / "sweeps" / f"{stamp}-{digest}").absolute()


def write_config(element: ResolvedConfig, run_dir: Path | None = None) -> Path:
    """The element's resolved config as <run dir>/config.yaml (the file every rank reads).

    An existing file is kept (a running element's file stays untouched when a sweep is submitted
    again) only once it is verified to be this config: a plain file, not a symlink, whose config id
    (the fingerprint the manifest records) is the element's; anything else is a ConfigError (exit 2)."""
    run_dir = run_dir or element.run_dir
    try:  # plain os calls: this runs 100,000 times for the largest sweep (benchmarks/launcher.py)
        os.mkdir(run_dir)
    except FileExistsError:
        if os.path.islink(run_dir):  # the run root was checked; its run directories are ours to check
            raise ConfigError(
                Problem(
                    f"is a symbolic link (to {os.readlink(run_dir)}); hpcrl never writes through one",
                    file=str(run_dir),
                    key="run_root",
                )
            ) from None
    except FileNotFoundError:
        run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG_FILE
    text = element.yaml_text()
    if os.path.lexists(path):
        verify_config(path, element.config_id, text)
    else:  # tmp + rename: never half a file
        _replace(path, text)
    return path


def _replace(path: Path, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    _write(tmp, text)
    os.replace(tmp, path)  # replaces a symlink itself, never the file it points at


def verify_config(path: Path, expected_id: str, expected_text: str | None = None) -> None:
    """Refuse a run directory's config.yaml that is not the config the manifest fingerprints: a symlink
    (it may point at any file, whose later edits would change the run), an unreadable file, or content
    whose config id is not `expected_id`. Equal bytes (`expected_text`) need no parsing."""

    def refuse(why: str) -> ConfigError:
        return ConfigError(
            Problem(
                f"{why}; a run directory's config.yaml must be the one hpcrl wrote for it: remove it "
                "(or the run directory), or choose another run_root",
                file=str(path),
                key="run_root",
            )
        )

    if os.path.islink(path):
        raise refuse(f"is a symlink (to {os.readlink(path)})")
    try:  # a regular file only (a FIFO would hang the open), and no larger than a config may be
        raw = read_capped(path, MAX_YAML_BYTES)
    except (OSError, ValueError) as err:
        raise refuse(f"cannot be read ({getattr(err, 'strerror', None) or err})") from None
    if expected_text is not None and raw == expected_text.encode():
        return
    try:
        found = config_id(load_yaml(path))
    except (ConfigError, OSError, ValueError, TypeError) as err:
        raise refuse(f"is not a readable config ({type(err).__name__})") from None
    if found != expected_id:
        raise refuse(
            f"holds config {found}, not {expected_id} (the manifest's fingerprint): edited, or another run's"
        )


def write_dry_run_config(element: ResolvedConfig, folder: Path) -> Path:
    """The element's resolved config as <folder>/<id>.yaml, for reading only (no rank reads it, so it is
    written in place: three system calls)."""
    path = folder / f"{element.config_id}.yaml"
    _write(path, element.yaml_text())
    return path


def _write(path: str | Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def prepare(
    sweep: Sweep,
    sweep_dir: Path,
    overrides: dict[str, Any] | None = None,
    *,
    dry_run: bool = False,
    track: Track = untracked,
) -> Manifest:
    """Write every element's config and the manifest (state NEW, or DRY_RUN); submits nothing.
    `dry_run`: the configs go inside the sweep directory, not into run directories.

    One element at a time: its config is written, and only its manifest entry is kept."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    state = "DRY_RUN" if dry_run else "NEW"
    folder = sweep_dir / DRY_RUN_CONFIGS
    if dry_run:
        folder.mkdir(exist_ok=True)
    entries, code = [], {}
    refused: list[Problem] = []
    for e in track(sweep.elements, len(sweep.elements), "writing configs"):
        run_dir = e.run_dir
        for spec in user_code_specs(e.config).values():  # user code: its digest at submit
            code.setdefault(spec, source_sha256(spec) or "unreadable")
        # A run dir's config.yaml that is not this element's is refused: all of them, then stop.
        try:
            config_path = write_dry_run_config(e, folder) if dry_run else write_config(e, run_dir)
        except ConfigError as err:
            refused += err.problems
            continue
        entries.append(
            Entry(
                index=e.index,
                config_id=e.config_id,
                config_path=str(config_path),
                run_dir=str(run_dir),
                swept=e.swept,
                state=state,
            )
        )
    if refused:
        raise ConfigError(refused)  # before the manifest: nothing is submitted
    manifest = Manifest(
        sweep_dir=str(sweep_dir),
        template=str(sweep.template),
        name=sweep.name,
        executor=sweep.elements[0].config.cluster.executor,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        keys=sweep.keys,
        entries=entries,
        overrides=overrides or {},
        code=code,
    )
    manifest.save()
    return manifest


def render_scripts(
    arrays: list[slurm.ArrayJob], sweep_dir: Path, python: str
) -> list[tuple[Path, list[int]]]:
    """Dry run: the sbatch script of every array job, written to <sweep dir>/sbatch/array-<k>.sh."""
    out = []
    folder = sweep_dir / SLURM_DIR
    for k, array in enumerate(arrays):
        path = sweep_dir / SBATCH_DIR / f"array-{k}.sh"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(slurm.render_sbatch(array.params, folder, len(array.indices), python))
        out.append((path, array.indices))
    return out


def submit_elements(
    manifest: Manifest,
    elements: Iterable[ResolvedConfig] = (),
    *,
    arrays: list[slurm.ArrayJob] | None = None,
    overrides: dict[str, Any] | None = None,
) -> None:
    """Submit `elements` (a subset of the manifest's) with the manifest's executor; saves the manifest.

    Slurm: `arrays` as hpcrl.launcher.preflight.plan made and checked them (planned and checked here
    when None: a ConfigError on a problem, before any sbatch). `overrides`: the keys a resume changed,
    recorded with each new array. A refused sbatch marks its elements SUBMIT_FAILED with sbatch's error
    as their reason (ClusterError, exit 1)."""
    recorded = {"overrides": overrides} if overrides else {}
    if manifest.executor == "local":
        indices = [e.index for e in elements]
        pid = local.start_runner(Path(manifest.sweep_dir), indices)
        for index in indices:
            _set_job(manifest.entries[index], f"local:{pid}_{index}", "PENDING")
        manifest.arrays.append({"job_id": f"local:{pid}", "indices": indices, **recorded})
        manifest.save()
        return
    folder = Path(manifest.sweep_dir) / SLURM_DIR
    if arrays is None:
        checked = preflight.plan(elements, manifest.name, folder, need_controller=True)
        if checked.problems:
            raise ConfigError(checked.problems)
        arrays = checked.arrays
    for k, array in enumerate(arrays):
        entries = [manifest.entries[i] for i in array.indices]
        try:
            array_id, job_ids, script = slurm.submit_array(
                array.params,
                folder,
                [e.config_path for e in entries],
                [e.run_dir for e in entries],
                max_requeues=array.max_requeues,
            )
        except ClusterError as err:
            reason = cut(str(err), slurm.REASON_CHARS)
            for rest in arrays[k:]:
                for i in rest.indices:
                    manifest.entries[i].state, manifest.entries[i].reason = "SUBMIT_FAILED", reason
            manifest.save()
            raise
        for job_id, entry in zip(job_ids, entries, strict=True):
            _set_job(entry, job_id, "PENDING")
        manifest.arrays.append({"job_id": array_id, "indices": array.indices, "script": script, **recorded})
        manifest.save()


def _set_job(entry: Entry, job_id: str, state: str) -> None:
    if entry.job_id:
        entry.attempts.append(entry.job_id)
    entry.job_id, entry.state, entry.reason = job_id, state, None


def refresh(manifest: Manifest, notes: list[str] | None = None, *, save: bool = True) -> Manifest:
    """Ask the scheduler for every submitted element's state and reason; save (unless `save` is False: a
    read-only viewer, `hpcrl serve`) and return the manifest. `notes` gets one line when the states did
    not come from accounting (hpcrl.launcher.slurm)."""
    submitted = [e for e in manifest.entries if e.job_id]
    if manifest.executor == "local":
        for e in submitted:
            # the runner's record, else (deleted by hand, a cleaned sweep) the manifest's last known state:
            # a known end stays (a FAILED element is resumed, a COMPLETED one is not), and an element
            # not ended whose runner is gone is LOST (it was UNKNOWN, which `resume` skipped)
            record = local.read_state(Path(manifest.sweep_dir), e.index)
            state = record.get("state", e.state)
            runner_pid = int(e.job_id.split(":")[1].split("_")[0])
            if state not in FINAL and not local.pid_alive(runner_pid):
                state = "LOST"
            e.state = state
            e.reason = _local_reason(e, record)
    else:
        observed, note = slurm.element_states(
            Path(manifest.sweep_dir) / SLURM_DIR, [e.job_id for e in submitted]
        )
        if note and notes is not None:
            notes.append(note)
        for e in submitted:
            seen = observed.get(e.job_id)
            if seen is None:
                continue
            # after our own scancel, only a final state replaces CANCELLED; a known end is never LOST
            if e.state == "CANCELLED" and (seen.state not in FINAL or seen.state == "LOST"):
                continue
            if seen.state == "LOST" and e.state in FINAL:
                continue
            e.state, e.reason = _known(seen)
            if e.state == "TIMEOUT" and launcher_record(e.run_dir).get("state") == "COMPLETED":
                e.state, e.reason = "COMPLETED", COMPLETED_AT_THE_LIMIT
    if save:
        manifest.save()
    return manifest


COMPLETED_AT_THE_LIMIT = "the run completed; Slurm's time limit came while its processes were exiting"
"""The reason shown for an element Slurm ended as TIMEOUT after its rank 0 recorded COMPLETED (every
step, the final evaluation and the export done: launcher.json): a last attempt that had little to do
but started late on a loaded node. Shown as COMPLETED: `resume` must not rerun a finished run."""


def _known(seen: slurm.Observed) -> tuple[str, str | None]:
    """A state the manifest may hold (manifest.STATES): one Slurm adds later is UNKNOWN, and says so."""
    if seen.state in SLURM_STATES:
        return seen.state, seen.reason
    return "UNKNOWN", cut(f"Slurm state {seen.state}" + (f": {seen.reason}" if seen.reason else ""), 200)


def launcher_record(run_dir: str) -> dict[str, Any]:
    """The element's <run dir>/launcher.json (restarts, rank 0's error); {} when absent or not a
    small regular file of a JSON object (a FIFO there must not hang `status`)."""
    return read_launcher_state(Path(run_dir))


def _local_reason(entry: Entry, record: dict[str, Any]) -> str | None:
    """A local element's reason: the first line of the error its rank 0 recorded, else its exit code."""
    if entry.state in ("COMPLETED", "PENDING", "RUNNING"):
        return None
    if entry.state == "LOST":
        return "its local runner is gone and recorded no end"
    if not record:
        return entry.reason  # the manifest's, the record being gone
    error = launcher_record(entry.run_dir).get("error")
    if error:
        return cut(str(error).strip().splitlines()[0], slurm.REASON_CHARS)
    code = record.get("exit_code")
    return f"exit {code}" if code not in (None, 0) else None


def cancel(manifest: Manifest, indices: list[int] | None, notes: list[str] | None = None) -> list[Entry]:
    """Cancel the given elements (all when None); returns the entries asked to stop. `notes` gets a
    line for each local element whose recorded process group was not its own (left alone)."""
    chosen = [manifest.entry(i) for i in indices] if indices else list(manifest.entries)
    chosen = [e for e in chosen if e.job_id]
    if manifest.executor == "local":
        left = [
            (e, local.cancel_local(Path(manifest.sweep_dir), e.index, e.config_path, e.run_dir))
            for e in chosen
        ]
        chosen = [e for e, note in left if note is None]
        if notes is not None:
            notes += [note for _, note in left if note]
    else:
        slurm.scancel(
            [e.job_id for e in chosen] if indices else sorted({e.job_id.split("_")[0] for e in chosen})
        )
    # sacct keeps no record of an array task cancelled while pending: remember the cancel here;
    # a later refresh overrides it with what sacct knows (e.g. COMPLETED if it had already finished).
    for e in chosen:
        if e.state not in FINAL:
            e.state = "CANCELLED"
    manifest.save()
    return chosen


def resubmittable(manifest: Manifest) -> list[Entry]:
    return [e for e in manifest.entries if e.state in RESUBMITTABLE]


def restart_count(entry: Entry) -> int:
    try:
        return int(launcher_record(entry.run_dir).get("restart_count", 0))
    except (TypeError, ValueError, OverflowError):
        return 0


RESUME_FIXED = {
    "cluster.profile": "the profile's values were merged into every element at submit",
    "cluster.executor": "the sweep's executor is fixed at submit",
    "cluster.setup": "shell setup lines come from a cluster profile only",
}
"""cluster keys `hpcrl resume` may not change, and why."""


def resume_override_problems(overrides: dict[str, Any]) -> list[Problem]:
    """`hpcrl resume` changes how elements run (cluster.*), not the experiment they are: a run directory's
    checkpoints belong to its experiment, and a different one is a new submit."""
    problems = []
    for key in overrides:
        if not key.startswith("cluster."):
            message = (
                "resume changes only cluster.* keys (how an element runs); another experiment is a new submit"
            )
        elif key in RESUME_FIXED:
            message = f"resume cannot change it: {RESUME_FIXED[key]}"
        else:
            continue
        problems.append(Problem(message, "command line", key))
    return problems


def resumed_element(entry: Entry, overrides: dict[str, Any]) -> ResolvedConfig:
    """The element `entry` runs again: its run dir's config.yaml, verified against the manifest's
    fingerprint (verify_config), with `overrides` applied (a mapping such as cluster.env merges into
    the element's own) and checked as a template's values are; ConfigError listing every problem."""
    # submitit and the rank machinery (~0.6 s): only a resume reads a run's config back
    from hpcrl.launcher.element import load_resolved

    path = Path(entry.config_path)
    verify_config(path, entry.config_id)
    cfg = load_resolved(path)
    data = stage_data(to_dict(cfg))  # what config.yaml and the id hold: the stage's sections
    if not overrides:
        return ResolvedConfig(entry.index, entry.config_id, cfg, data, entry.swept)
    for key, value in overrides.items():
        current = get_dotted(data, key, None)
        if isinstance(value, dict) and isinstance(current, dict):
            value = deep_merge(current, value)
        data = with_values(data, {key: value})
    checked, problems = check_tree(
        data, ExperimentConfig, lambda key: "command line" if key in overrides else str(path)
    )
    problems += section_problems(checked.get("stage", cfg.stage), overrides, lambda key: "command line")
    if problems:
        raise ConfigError(problems)
    cfg = build(ExperimentConfig, checked)
    data = stage_data(to_dict(cfg))
    return ResolvedConfig(entry.index, config_id(data), cfg, data, entry.swept)


def rewrite_config(entry: Entry, element: ResolvedConfig) -> None:
    """A resume with overrides: the element's new config.yaml replaces the old one in its run dir (the
    run dir, its checkpoints and its logs stay), and the manifest's fingerprint follows."""
    if element.config_id == entry.config_id:
        return
    _replace(Path(entry.config_path), element.yaml_text())
    entry.config_id = element.config_id
