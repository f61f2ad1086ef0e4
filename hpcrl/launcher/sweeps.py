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

from hpcrl.config.resolve import ResolvedConfig, Sweep
from hpcrl.config.text_rules import path_problem
from hpcrl.errors import ClusterError, ConfigError, Problem
from hpcrl.launcher import local, slurm
from hpcrl.launcher.manifest import FINAL, MANIFEST, RESUBMITTABLE, Entry, Manifest, load_manifest
from hpcrl.progress import Track, untracked

CONFIG_FILE = "config.yaml"
SLURM_DIR = "slurm"
DRY_RUN_CONFIGS = "configs"
SBATCH_DIR = "sbatch"


def sweep_dir_problems(sweep_dir: Path, key: str) -> list[Problem]:
    """The sweep directory (given as --sweep_dir, or made of run_root and name) is a path value, and it
    holds no '%': submitit writes it into #SBATCH --output/--error, where Slurm reads %<letter> as a
    pattern (the logs would go to another directory)."""
    text = str(sweep_dir)
    problem = path_problem(text) or (
        "has a '%', which Slurm reads as a file name pattern" if "%" in text else None
    )
    return [Problem(problem, key=key)] if problem else []


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
        inside = path is not None and sweep_dir is not None and path.is_relative_to(sweep_dir)
        message = f"cannot create or write a file or directory here: {err.strerror or err}"
        raise ConfigError(
            Problem(message, file=None if path is None else str(path), key=key if inside else "run_root")
        ) from None


def default_sweep_dir(sweep: Sweep) -> Path:
    first = sweep.elements[0].config
    digest = hashlib.sha256("".join(sweep.elements.ids).encode()).hexdigest()[:6]
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return (Path(first.run_root) / sweep.name / "sweeps" / f"{stamp}-{digest}").absolute()


def write_config(element: ResolvedConfig, run_dir: Path | None = None) -> Path:
    """The element's resolved config as <run dir>/config.yaml (the file every rank reads)."""
    run_dir = run_dir or element.run_dir
    try:  # plain os calls: this runs 100,000 times for the largest sweep (benchmarks/launcher.py)
        os.mkdir(run_dir)
    except FileExistsError:
        pass
    except FileNotFoundError:
        run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG_FILE
    # Same id = same content, so an existing file is already right; skipping the write keeps a
    # running element's file untouched when a sweep is submitted again. tmp + rename: never half a file.
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        _write(tmp, element.yaml_text())
        os.replace(tmp, path)
    return path


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
    entries = []
    for e in track(sweep.elements, len(sweep.elements), "writing configs"):
        run_dir = e.run_dir
        config_path = write_dry_run_config(e, folder) if dry_run else write_config(e, run_dir)
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
    manifest = Manifest(
        sweep_dir=str(sweep_dir),
        template=str(sweep.template),
        name=sweep.name,
        executor=sweep.elements[0].config.cluster.executor,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        keys=sweep.keys,
        entries=entries,
        overrides=overrides or {},
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
    manifest: Manifest, elements: Iterable[ResolvedConfig], max_array: int | None = None
) -> None:
    """Submit `elements` (a subset of the manifest's) with the manifest's executor; saves the manifest.

    `max_array`: MaxArraySize, asked from the controller when None.
    """
    if manifest.executor == "local":
        indices = [e.index for e in elements]
        pid = local.start_runner(Path(manifest.sweep_dir), indices)
        for index in indices:
            _set_job(manifest.entries[index], f"local:{pid}_{index}", "PENDING")
        manifest.arrays.append({"job_id": f"local:{pid}", "indices": indices})
        manifest.save()
        return
    folder = Path(manifest.sweep_dir) / SLURM_DIR
    arrays = slurm.plan_arrays(elements, manifest.name, max_array or slurm.max_array_size())
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
        except ClusterError:
            for rest in arrays[k:]:
                for i in rest.indices:
                    manifest.entries[i].state = "SUBMIT_FAILED"
            manifest.save()
            raise
        for job_id, entry in zip(job_ids, entries, strict=True):
            _set_job(entry, job_id, "PENDING")
        manifest.arrays.append({"job_id": array_id, "indices": array.indices, "script": script})
        manifest.save()


def _set_job(entry: Entry, job_id: str, state: str) -> None:
    if entry.job_id:
        entry.attempts.append(entry.job_id)
    entry.job_id, entry.state = job_id, state


def refresh(manifest: Manifest) -> Manifest:
    """Ask the scheduler for every submitted element's state; save and return the manifest."""
    submitted = [e for e in manifest.entries if e.job_id]
    if manifest.executor == "local":
        for e in submitted:
            state = local.read_state(Path(manifest.sweep_dir), e.index).get("state", "UNKNOWN")
            runner_pid = int(e.job_id.split(":")[1].split("_")[0])
            if state in ("PENDING", "RUNNING") and not local.pid_alive(runner_pid):
                state = "LOST"
            e.state = state
    else:
        states = slurm.sacct_states([e.job_id.split("_")[0] for e in submitted])
        for e in submitted:
            new = states.get(e.job_id)
            # after our own scancel, only a final state from accounting replaces CANCELLED
            if new and not (e.state == "CANCELLED" and new not in FINAL):
                e.state = new
    manifest.save()
    return manifest


def cancel(manifest: Manifest, indices: list[int] | None) -> list[Entry]:
    """Cancel the given elements (all when None); returns the entries asked to stop."""
    chosen = [manifest.entry(i) for i in indices] if indices else list(manifest.entries)
    chosen = [e for e in chosen if e.job_id]
    if manifest.executor == "local":
        for e in chosen:
            local.cancel_local(Path(manifest.sweep_dir), e.index)
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
    import json

    try:
        return int(json.loads((Path(entry.run_dir) / "launcher.json").read_text()).get("restart_count", 0))
    except (FileNotFoundError, ValueError):
        return 0
