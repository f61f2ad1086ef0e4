"""A pipeline's state: each stage's, from its record (was it queued) and its elements' Slurm states.

A stage is WAITING while its elements pend on their dependency, and CANCELLED_BY_UPSTREAM when Slurm
removed it because an upstream stage failed (reason DependencyNeverSatisfied, `--kill-on-invalid-dep`):
shown with the upstream stage that failed, which is what a user looks for at 3 a.m.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hpcrl.launcher import sweeps
from hpcrl.launcher.sweep_manifest import RESUBMITTABLE, Manifest, load_manifest
from hpcrl.pipeline.manifest import PipelineManifest

DEPENDENCY_REASONS = ("Dependency",)
"""Slurm's reason of a job pending on its dependency."""
NEVER_SATISFIED = "DependencyNeverSatisfied"
"""scontrol's reason of a job whose dependency can no longer be met; sacct records such a job, removed by
`--kill-on-invalid-dep`, as CANCELLED with reason `Dependency` (measured on the dev cluster, Slurm 22.05)."""
UPSTREAM_FAILED = ("FAILED", "CANCELLED_BY_UPSTREAM", "CANCELLED", "SUBMIT_FAILED")
"""An upstream stage in one of these states never satisfies `afterok`."""
"""Slurm's reason of a job whose dependency can no longer be met (an upstream job failed)."""


@dataclass(frozen=True)
class StageStatus:
    name: str
    after: list[str]
    state: str
    """NEW, SUBMIT_FAILED, CANCELLED (the record's), else from the elements: COMPLETED, RUNNING, WAITING,
    PENDING, FAILED (some element ended otherwise than COMPLETED), CANCELLED_BY_UPSTREAM."""
    reason: str | None
    counts: dict[str, int]
    manifest: Manifest | None


def pipeline_status(record: PipelineManifest, notes: list[str] | None = None) -> list[StageStatus]:
    """Every stage's state, in order; each stage's sweep manifest is refreshed from Slurm (and saved)."""
    out: list[StageStatus] = []
    for stage in record.stages:
        if stage.state not in ("QUEUED", "CANCELLED") or not stage.job_ids:
            out.append(StageStatus(stage.name, stage.after, stage.state, stage.reason, {}, None))
            continue
        manifest = sweeps.refresh(load_manifest(record.stage_dir(stage.name)), notes)
        counts = Counter(e.state for e in manifest.entries)
        state, reason = _stage_state(manifest, out, stage.after)
        if stage.state == "CANCELLED" and state != "COMPLETED":
            state, reason = "CANCELLED", stage.reason
        out.append(StageStatus(stage.name, stage.after, state, reason, dict(counts), manifest))
    return out


def _stage_state(manifest: Manifest, upstream: list[StageStatus], after: list[str]) -> tuple[str, str | None]:
    states = [e.state for e in manifest.entries]
    reasons = [e.reason or "" for e in manifest.entries]
    if all(s == "COMPLETED" for s in states):
        return "COMPLETED", None
    failed = [u.name for u in upstream if u.name in after and u.state in UPSTREAM_FAILED]
    removed = all(s in ("CANCELLED", "COMPLETED") for s in states)
    by_dependency = (
        any(  # an element cancelled by hand while its upstream is healthy is not the upstream's doing
            NEVER_SATISFIED in r or (failed and s == "CANCELLED" and r.startswith(DEPENDENCY_REASONS))
            for s, r in zip(states, reasons, strict=True)
        )
    )
    if by_dependency or (failed and removed):
        culprit = failed[0] if failed else ", ".join(after)
        why = f"upstream stage {culprit} did not complete: Slurm removed it ({NEVER_SATISFIED})"
        return "CANCELLED_BY_UPSTREAM", why
    ended_badly = [e for e in manifest.entries if e.state in RESUBMITTABLE]
    if ended_badly:
        first = ended_badly[0]
        return "FAILED", f"element {first.index} {first.state}" + (
            f": {first.reason}" if first.reason else ""
        )
    if any(s == "RUNNING" for s in states):
        return "RUNNING", None
    pending = [r for s, r in zip(states, reasons, strict=True) if s == "PENDING"]
    if len(pending) == len(states) and all(r.startswith(DEPENDENCY_REASONS) for r in pending):
        return "WAITING", f"on {', '.join(after)}"
    return ("PENDING" if len(pending) == len(states) else "RUNNING"), None
